package simdisk

import (
	"errors"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/internal/wal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func seeded(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0)) }

// create opens name for writing on d, creating it; closed at the end.
func create(t *testing.T, d *Disk, name string, dsync bool) wal.File {
	t.Helper()
	f, err := d.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600, dsync)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func write(t *testing.T, f wal.File, s string, off int64) {
	t.Helper()
	n, err := f.WriteAt([]byte(s), off)
	require.NoError(t, err)
	require.Equal(t, len(s), n)
}

// contents is what name holds on d, "" with ok false if nothing.
func contents(t *testing.T, d *Disk, name string) (string, bool) {
	t.Helper()
	b, err := d.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false
	}
	require.NoError(t, err)
	return string(b), true
}

// What a crash keeps under the zero Options: exactly what was synced,
// file data by SyncData and directory entries by SyncDir, each on its
// own. Checked to fail with Crash keeping the cache (data = data), and
// with SyncData also syncing the directory.
func TestCrashKeepsWhatWasSynced(t *testing.T) {
	tests := []struct {
		name     string
		give     func(t *testing.T, d *Disk)
		want     string
		wantFile bool
	}{
		{name: "created, nothing synced", give: func(t *testing.T, d *Disk) {
			write(t, create(t, d, "/j/log", false), "data", 0)
		}},
		{name: "data synced, directory not", give: func(t *testing.T, d *Disk) {
			f := create(t, d, "/j/log", false)
			write(t, f, "data", 0)
			require.NoError(t, f.SyncData())
		}},
		{name: "directory synced, data not", give: func(t *testing.T, d *Disk) {
			write(t, create(t, d, "/j/log", false), "data", 0)
			require.NoError(t, d.SyncDir("/j"))
		}, wantFile: true},
		{name: "both", give: func(t *testing.T, d *Disk) {
			f := create(t, d, "/j/log", false)
			write(t, f, "data", 0)
			require.NoError(t, f.SyncData())
			require.NoError(t, d.SyncDir("/j"))
		}, want: "data", wantFile: true},
		{name: "another directory synced", give: func(t *testing.T, d *Disk) {
			f := create(t, d, "/j/log", false)
			write(t, f, "data", 0)
			require.NoError(t, f.SyncData())
			require.NoError(t, d.SyncDir("/k"))
		}},
		{name: "a write after the sync", give: func(t *testing.T, d *Disk) {
			f := create(t, d, "/j/log", false)
			write(t, f, "data", 0)
			require.NoError(t, f.SyncData())
			require.NoError(t, d.SyncDir("/j"))
			write(t, f, "more", 4)
			write(t, f, "DA", 0)
		}, want: "data", wantFile: true},
		{name: "a truncation after the sync", give: func(t *testing.T, d *Disk) {
			f := create(t, d, "/j/log", false)
			write(t, f, "data", 0)
			require.NoError(t, f.SyncData())
			require.NoError(t, d.SyncDir("/j"))
			require.NoError(t, f.Truncate(1))
		}, want: "data", wantFile: true},
		{name: "a dsync write", give: func(t *testing.T, d *Disk) {
			write(t, create(t, d, "/j/log", true), "data", 0)
			require.NoError(t, d.SyncDir("/j"))
		}, want: "data", wantFile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New(nil)
			tt.give(t, d)
			d.Crash(nil)
			got, ok := contents(t, d, "/j/log")
			assert.Equal(t, tt.wantFile, ok, "the entry")
			assert.Equal(t, tt.want, got)
		})
	}
}

// A rename and a removal are undone by a crash before the directory's
// sync, and kept after it; a file open across them keeps its contents.
// Checked to fail with Rename changing the durable entries at once.
func TestCrashDirectoryChanges(t *testing.T) {
	setup := func(t *testing.T) *Disk {
		d := New(nil)
		d.WriteFile("/j/log", []byte("old"), 0o600)
		f := create(t, d, "/j/log.new", false)
		write(t, f, "new", 0)
		require.NoError(t, f.SyncData())
		return d
	}
	t.Run("rename unsynced", func(t *testing.T) {
		d := setup(t)
		require.NoError(t, d.Rename("/j/log.new", "/j/log"))
		got, _ := contents(t, d, "/j/log")
		require.Equal(t, "new", got, "before the crash")
		d.Crash(nil)
		got, _ = contents(t, d, "/j/log")
		assert.Equal(t, "old", got)
		assert.Equal(t, []string{"/j/log"}, d.Names(), "the new file's entry was never synced")
	})
	t.Run("rename synced", func(t *testing.T) {
		d := setup(t)
		require.NoError(t, d.Rename("/j/log.new", "/j/log"))
		require.NoError(t, d.SyncDir("/j"))
		d.Crash(nil)
		got, _ := contents(t, d, "/j/log")
		assert.Equal(t, "new", got)
		assert.Equal(t, []string{"/j/log"}, d.Names())
		assert.Equal(t, 1, d.DirSyncs("/j/"))
	})
	t.Run("remove", func(t *testing.T) {
		d := setup(t)
		f, err := d.OpenFile("/j/log", os.O_RDONLY, 0, false)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, d.Remove("/j/log"))
		_, ok := contents(t, d, "/j/log")
		require.False(t, ok)
		buf := make([]byte, 3)
		_, err = f.ReadAt(buf, 0)
		require.NoError(t, err)
		assert.Equal(t, "old", string(buf), "an open file keeps its contents")
		d.Crash(nil)
		got, _ := contents(t, d, "/j/log")
		assert.Equal(t, "old", got, "the removal undone")
	})
}

// Under TornSector a crash keeps a prefix of the unsynced writes in
// order, the last one cut at a sector boundary of the file; under
// TornByte at any byte; never anything of a later write without the
// earlier ones. Over many seeds every kind of outcome occurs. Checked to
// fail with cut ignoring the sector (any byte).
func TestCrashTorn(t *testing.T) {
	for _, torn := range []Torn{TornSector, TornByte} {
		t.Run(map[Torn]string{TornSector: "sector", TornByte: "byte"}[torn], func(t *testing.T) {
			lens := map[int]bool{}
			for seed := range uint64(200) {
				d := New(&Options{Torn: torn, SectorSize: 4})
				d.WriteFile("/log", []byte("ab"), 0o600)
				f, err := d.OpenFile("/log", os.O_RDWR, 0, false)
				require.NoError(t, err)
				write(t, f, "cdefghij", 2) // ends at 10, boundaries at 4 and 8
				write(t, f, "klmn", 10)
				d.Crash(seeded(seed))
				got, _ := contents(t, d, "/log")
				require.True(t, len(got) >= 2, "the synced part")
				assert.Equal(t, "abcdefghijklmn"[:len(got)], got, "a prefix, in order")
				if torn == TornSector && len(got) < 10 {
					assert.Contains(t, []int{2, 4, 8}, len(got), "cut at a sector boundary")
				}
				lens[len(got)] = true
			}
			assert.True(t, lens[2] && lens[14] && len(lens) > 3, "none, all and torn outcomes: %v", lens)
		})
	}
}

// ENOSPC and EIO from a Fault fail the call, typed, and change nothing;
// a failed sync drops what it would have made durable, even from a later
// sync that succeeds (Linux's clean-after-EIO pages). Checked to fail
// with a failed sync leaving the pending writes for the next one.
func TestFaults(t *testing.T) {
	t.Run("write", func(t *testing.T) {
		for _, give := range []error{syscall.ENOSPC, syscall.EIO} {
			d := New(nil)
			f := create(t, d, "/log", false)
			d.SetFault(FailNth(OpWrite, 2, give))
			write(t, f, "one", 0)
			_, err := f.WriteAt([]byte("two"), 3)
			assert.ErrorIs(t, err, give)
			var pe *fs.PathError
			assert.ErrorAs(t, err, &pe)
			write(t, f, "six", 3)
			got, _ := contents(t, d, "/log")
			assert.Equal(t, "onesix", got)
		}
	})
	t.Run("sync", func(t *testing.T) {
		d := New(nil)
		d.WriteFile("/log", nil, 0o600)
		f, err := d.OpenFile("/log", os.O_RDWR, 0, false)
		require.NoError(t, err)
		d.SetFault(FailNth(OpSync, 1, syscall.EIO))
		write(t, f, "lost", 0)
		assert.ErrorIs(t, f.SyncData(), syscall.EIO)
		got, _ := contents(t, d, "/log")
		assert.Equal(t, "lost", got, "still in the cache")
		write(t, f, "kept", 4)
		require.NoError(t, f.SyncData())
		d.Crash(nil)
		got, _ = contents(t, d, "/log")
		assert.Equal(t, "\x00\x00\x00\x00kept", got, "the failed sync's write never durable")
	})
	t.Run("dsync write", func(t *testing.T) {
		d := New(nil)
		d.WriteFile("/log", nil, 0o600)
		f, err := d.OpenFile("/log", os.O_RDWR, 0, true)
		require.NoError(t, err)
		require.True(t, f.WriteSyncs())
		d.SetFault(FailNth(OpSync, 1, syscall.EIO))
		_, err = f.WriteAt([]byte("lost"), 0)
		assert.ErrorIs(t, err, syscall.EIO)
		d.Crash(nil)
		got, _ := contents(t, d, "/log")
		assert.Empty(t, got)
	})
	t.Run("no dsync", func(t *testing.T) {
		d := New(&Options{NoDSync: true})
		f := create(t, d, "/log", true)
		assert.False(t, f.WriteSyncs())
	})
	t.Run("from", func(t *testing.T) {
		d := New(nil)
		f := create(t, d, "/log", false)
		d.SetFault(FailFrom(OpWrite, 2, syscall.ENOSPC))
		write(t, f, "one", 0)
		for range 3 {
			_, err := f.WriteAt([]byte("x"), 3)
			assert.ErrorIs(t, err, syscall.ENOSPC)
		}
	})
}

// With syncs ignored nothing becomes durable, and directory syncs are
// still counted.
func TestIgnoreSyncs(t *testing.T) {
	d := New(nil)
	d.SetIgnoreSyncs(true)
	f := create(t, d, "/j/log", true)
	write(t, f, "data", 0)
	require.NoError(t, f.SyncData())
	require.NoError(t, d.SyncDir("/j"))
	assert.Equal(t, 1, d.DirSyncs("/j"))
	d.Crash(nil)
	_, ok := contents(t, d, "/j/log")
	assert.False(t, ok)
}

// HaltAt cuts the power at the nth mutating call: it and every later
// call fail with ErrHalted; a cut write may survive torn; Crash brings
// the power back. Reads and stats do not count. Checked to fail with the
// cut write dropped (no torn write ever survives).
func TestHaltAt(t *testing.T) {
	kept := map[int]bool{}
	for seed := range uint64(50) {
		d := New(&Options{Torn: TornByte})
		d.WriteFile("/log", []byte("ab"), 0o600)
		f, err := d.OpenFile("/log", os.O_RDWR, 0, false)
		require.NoError(t, err)
		d.HaltAt(2)
		_, err = f.Stat()
		require.NoError(t, err, "not a mutation")
		write(t, f, "cd", 2)
		_, err = f.WriteAt([]byte("efgh"), 4)
		require.ErrorIs(t, err, ErrHalted)
		require.True(t, d.Halted())
		_, err = f.ReadAt(make([]byte, 1), 0)
		assert.ErrorIs(t, err, ErrHalted)
		_, err = d.Stat("/log")
		assert.ErrorIs(t, err, ErrHalted)
		d.Crash(seeded(seed))
		assert.False(t, d.Halted())
		_, err = f.ReadAt(make([]byte, 1), 0)
		assert.ErrorIs(t, err, ErrHalted, "a file of the dead process")
		assert.NoError(t, f.Close())
		got, _ := contents(t, d, "/log")
		assert.Equal(t, "abcdefgh"[:len(got)], got)
		kept[len(got)] = true
	}
	assert.True(t, kept[2] && kept[4] && kept[8] && len(kept) > 3, "outcomes: %v", kept)
}

// A Fault returning ErrHalted cuts the power at that call.
func TestFaultHalts(t *testing.T) {
	d := New(nil)
	f := create(t, d, "/log", false)
	d.SetFault(func(op Op) error {
		if op.Kind == OpSync {
			return ErrHalted
		}
		return nil
	})
	write(t, f, "x", 0)
	assert.ErrorIs(t, f.SyncData(), ErrHalted)
	assert.True(t, d.Halted())
}

// The writer's lock excludes a second one until Close, Kill or Crash.
func TestLock(t *testing.T) {
	d := New(nil)
	a := create(t, d, "/log", false)
	b := create(t, d, "/log", false)
	require.NoError(t, a.Lock())
	assert.ErrorIs(t, b.Lock(), wal.ErrLocked)
	require.NoError(t, a.Close())
	require.NoError(t, b.Lock())
	d.Kill()
	c := create(t, d, "/log", false)
	assert.NoError(t, c.Lock(), "the dead process's lock released")
}

// Kill keeps the cache: what was written and not synced is still there.
func TestKillKeepsTheCache(t *testing.T) {
	d := New(nil)
	f := create(t, d, "/log", false)
	write(t, f, "cached", 0)
	d.Kill()
	_, err := f.WriteAt([]byte("x"), 0)
	assert.ErrorIs(t, err, ErrHalted)
	got, ok := contents(t, d, "/log")
	assert.True(t, ok)
	assert.Equal(t, "cached", got)
}

// A clone shares nothing: what is done to one is not seen in the other,
// and two clones crash alike with one seed.
func TestClone(t *testing.T) {
	d := New(&Options{Torn: TornByte})
	f := create(t, d, "/log", false)
	write(t, f, "synced", 0)
	require.NoError(t, f.SyncData())
	require.NoError(t, d.SyncDir("/"))
	write(t, f, "-cached", 6)
	c1, c2 := d.Clone(), d.Clone()
	write(t, f, "!", 0)
	got, _ := contents(t, c1, "/log")
	assert.Equal(t, "synced-cached", got, "the clone as it was")
	for seed := range uint64(20) {
		a, b := c1.Clone(), c2.Clone()
		a.Crash(seeded(seed))
		b.Crash(seeded(seed))
		ga, _ := contents(t, a, "/log")
		gb, _ := contents(t, b, "/log")
		assert.Equal(t, ga, gb)
		assert.Equal(t, "synced-cached"[:len(ga)], ga)
	}
	got, _ = contents(t, d, "/log")
	assert.Equal(t, "!ynced-cached", got, "untouched by the clones")
}

// The same calls and seed give the same disk; the state does not depend
// on map order. Checked to fail with Crash visiting files in map order.
func TestDeterministic(t *testing.T) {
	run := func(seed uint64) []string {
		d := New(&Options{Torn: TornByte, DirPrefix: true})
		for i := range 20 {
			f, err := d.OpenFile(string(rune('a'+i)), os.O_RDWR|os.O_CREATE, 0o600, false)
			require.NoError(t, err)
			write(t, f, "0123456789", 0)
			if i%3 == 0 {
				require.NoError(t, f.SyncData())
			}
			require.NoError(t, f.Close())
		}
		d.Crash(seeded(seed))
		var out []string
		for _, n := range d.Names() {
			b, err := d.ReadFile(n)
			require.NoError(t, err)
			out = append(out, n+"="+string(b))
		}
		return out
	}
	first := run(7)
	for range 5 {
		assert.Equal(t, first, run(7))
	}
	assert.NotEqual(t, first, run(8), "another seed, another crash")
}

// ReadAt reports io.EOF past the end, as os.File does.
func TestReadAtEOF(t *testing.T) {
	d := New(nil)
	f := create(t, d, "/log", false)
	write(t, f, "abc", 0)
	buf := make([]byte, 4)
	n, err := f.ReadAt(buf, 1)
	assert.Equal(t, 2, n)
	assert.ErrorIs(t, err, io.EOF)
	_, err = f.ReadAt(buf, 3)
	assert.ErrorIs(t, err, io.EOF)
}

// OpenFile's flags: O_EXCL refuses an existing file, a missing file
// without O_CREATE is ErrNotExist, a read-only file refuses writes.
func TestOpenFlags(t *testing.T) {
	d := New(nil)
	d.WriteFile("/log", []byte("x"), 0o600)
	_, err := d.OpenFile("/log", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600, false)
	assert.ErrorIs(t, err, fs.ErrExist)
	_, err = d.OpenFile("/none", os.O_RDONLY, 0, false)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	f, err := d.OpenFile("/log", os.O_RDONLY, 0, false)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("y"), 0)
	assert.ErrorIs(t, err, syscall.EBADF)
	g, err := d.OpenFile("/log", os.O_RDWR|os.O_TRUNC, 0, false)
	require.NoError(t, err)
	defer g.Close()
	fi, err := g.Stat()
	require.NoError(t, err)
	assert.Zero(t, fi.Size())
	now, err := d.Stat("/log")
	require.NoError(t, err)
	assert.True(t, d.SameFile(fi, now))
}
