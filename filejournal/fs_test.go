package filejournal

import (
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// fsPath is where the journal lives on a simulated disk: a directory
// that does not exist on the machine, so that a file access that went
// to package os instead of Options.FS fails (or is seen).
const fsPath = "/simulated-disk-only/journal"

// Every file access of the journal goes through Options.FS: the journal
// itself, the index file a clean close writes and the next open reads,
// the index file's temporary file, and a compaction's new file. Checked
// to fail with openFjIndex reading through os.Open (the second open then
// replays the whole file: IndexLoaded is false), and with the index
// writer creating its file with os.CreateTemp (Close writes no index
// file on the disk).
func TestJournalEveryFileAccessGoesThroughFS(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	d := simdisk.New(nil)
	seen := map[string]bool{}
	d.SetFault(func(op simdisk.Op) error {
		seen[op.Path] = true
		if op.NewPath != "" {
			seen[op.NewPath] = true
		}
		return nil
	})
	opts := &Options{FS: d, PruneInterval: -1}
	j, err := Open(fsPath, opts)
	require.NoError(t, err)
	for _, k := range []string{"k-1", "k-2", "k-3"} {
		_, err := j.Begin(ctx, ijEntry(k, "op-"+k))
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "k-2", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: ijT0}))
	require.NoError(t, j.Delete(ctx, "k-3"))
	require.NoError(t, j.Compact(ctx))
	require.NoError(t, j.Close())
	assert.Equal(t, []string{fsPath, fsPath + indexSuffix}, d.Names(), "the journal and its index file, on the disk")
	assert.True(t, seen[fsPath+".compact"], "the compaction's file went through the disk: %v", seen)
	assert.True(t, seen[fsPath+indexSuffix+".tmp-1"], "the index file's temporary file too: %v", seen)
	_, err = os.Stat("/simulated-disk-only")
	assert.ErrorIs(t, err, os.ErrNotExist, "nothing went to the machine's disk")

	j, err = Open(fsPath, opts)
	require.NoError(t, err)
	assert.True(t, j.Stats().IndexLoaded, "the open read the index file from the disk")
	got, err := j.Lookup(ctx, "op-k-2")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, got.State)
	require.NoError(t, j.Verify(ctx))
	require.NoError(t, j.Close())
}

// Two copies of one journal that diverged (a backup restored beside the
// original: the same salt, then writes of the same sizes, so that each
// ends in a close marker where the other's is, of the same length and
// sequence number) do not accept each other's index file: a copy given
// the other's opens from its own records, not from the other's index
// (issue 22 §2.9). The control: each copy opens from its own. Checked to
// fail with every close marker's nonce 0 (the second copy then loads the
// first's index file and shows its entry), and with the index file not
// naming the nonce (no copy then opens from its own).
func TestJournalDivergedCopiesRefuseEachOthersIndexFile(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	clock := func() time.Time { return ijT0 }
	d := simdisk.New(nil)
	j, err := Open(fsPath, &Options{FS: d, Clock: clock, PruneInterval: -1})
	require.NoError(t, err)
	_, err = j.Begin(ctx, ijEntry("k-common", ""))
	require.NoError(t, err)
	require.NoError(t, j.Close())

	diverge := func(key string) *simdisk.Disk {
		c := d.Clone()
		j, err := Open(fsPath, &Options{FS: c, Clock: clock, PruneInterval: -1})
		require.NoError(t, err)
		_, err = j.Begin(ctx, ijEntry(key, ""))
		require.NoError(t, err)
		require.NoError(t, j.Close())
		return c
	}
	a, b := diverge("k-a"), diverge("k-b") // keys of one length: writes of one size
	ja, err := a.ReadFile(fsPath)
	require.NoError(t, err)
	jb, err := b.ReadFile(fsPath)
	require.NoError(t, err)
	ja, jb = usedBytes(t, ja), usedBytes(t, jb)
	require.Equal(t, len(ja), len(jb))
	marker := len(ja) - (wal.BatchHeaderLen + wal.RecordHeaderLen + 9)
	assert.Equal(t, ja[:wal.FileHeaderLen], jb[:wal.FileHeaderLen], "the same salt")
	assert.Equal(t, ja[marker+4:marker+16], jb[marker+4:marker+16], "markers of the same length and sequence number")
	assert.NotEqual(t, ja[marker:], jb[marker:], "the markers differ (their nonces)")

	keys := func(disk *simdisk.Disk, index []byte) ([]string, bool) {
		c := disk.Clone()
		if index != nil {
			c.WriteFile(fsPath+indexSuffix, index, 0o600)
		}
		j, err := Open(fsPath, &Options{FS: c, Clock: clock, PruneInterval: -1})
		require.NoError(t, err)
		defer func() { require.NoError(t, j.Close()) }()
		require.NoError(t, j.Verify(ctx))
		var ks []string
		for _, k := range []string{"k-common", "k-a", "k-b"} {
			if _, err := j.Get(ctx, k); err == nil {
				ks = append(ks, k)
			}
		}
		return ks, j.Stats().IndexLoaded
	}
	ia, err := a.ReadFile(fsPath + indexSuffix)
	require.NoError(t, err)
	ib, err := b.ReadFile(fsPath + indexSuffix)
	require.NoError(t, err)

	got, loaded := keys(b, ia)
	assert.False(t, loaded, "b does not open from a's index file")
	assert.Equal(t, []string{"k-common", "k-b"}, got)
	got, loaded = keys(a, ib)
	assert.False(t, loaded, "nor a from b's")
	assert.Equal(t, []string{"k-common", "k-a"}, got)

	got, loaded = keys(a, nil)
	assert.True(t, loaded, "each opens from its own")
	assert.Equal(t, []string{"k-common", "k-a"}, got)
	got, loaded = keys(b, nil)
	assert.True(t, loaded)
	assert.Equal(t, []string{"k-common", "k-b"}, got)
}

// With Options.Rand and Options.Clock, a journal's files are the same,
// byte for byte, on every run (what the simulator's replay of a seed
// needs): salts, close markers' nonces, entries' times, index files. The
// control: without Rand, the salts differ. Checked to fail with Open not
// passing Rand on to the log.
func TestJournalBytesAreReproducible(t *testing.T) {
	ijIndexAlways(t)
	ctx := context.Background()
	run := func(seeded bool) map[string]string {
		d := simdisk.New(nil)
		opts := &Options{FS: d, Clock: func() time.Time { return ijT0 }, Uptime: func() (string, time.Duration) { return "test", 0 }, PruneInterval: -1}
		if seeded {
			opts.Rand = rand.NewChaCha8([32]byte{1})
		}
		for round := range 2 {
			j, err := Open(fsPath, opts)
			require.NoError(t, err)
			_, err = j.Begin(ctx, ijEntry("k-"+strings.Repeat("x", round), ""))
			require.NoError(t, err)
			require.NoError(t, j.Compact(ctx))
			require.NoError(t, j.Close())
		}
		files := map[string]string{}
		for _, name := range d.Names() {
			b, err := d.ReadFile(name)
			require.NoError(t, err)
			files[name] = string(b)
		}
		return files
	}
	first := run(true)
	assert.Len(t, first, 2)
	assert.Equal(t, first, run(true))
	assert.NotEqual(t, run(false)[fsPath], run(false)[fsPath])
}
