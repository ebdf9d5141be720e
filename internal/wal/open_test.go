package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileState is what a test compares of a file before and after.
type fileState struct {
	data []byte
	mode os.FileMode
}

// dirState returns every file in dir, with its bytes and mode.
func dirState(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	m := make(map[string]fileState, len(entries))
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		fi, err := os.Stat(p)
		require.NoError(t, err)
		m[e.Name()] = fileState{data: data, mode: fi.Mode()}
	}
	return m
}

// writeFile writes data to path with mode, whatever the umask.
func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, mode))
	require.NoError(t, os.Chmod(path, mode))
}

// A read-only open changes nothing: no lock, no write, no mode change, no
// repair. A torn tail is ignored (reported, not cut off or kept aside), a
// leftover rewrite file is left, and every file is as it was, also after
// Close. Checked to fail with ReadOnly opening as a writer does.
func TestOpenReadOnlyChangesNothing(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	l := openLog(t, path, nil)
	appendRecord(t, l, "Bone")
	appendRecord(t, l, "Btwo")
	require.NoError(t, l.Close())
	raw := readUsed(t, path)
	tail := batch(4, rec("Btorn"))[:15]
	writeFile(t, path, cat(raw, tail), 0o644)
	writeFile(t, path+RewriteSuffix, []byte("a rewrite a crash interrupted"), 0o600)
	before := dirState(t, dir)

	var c collect
	ro, err := Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads)
	st := ro.Stats()
	assert.Equal(t, tornLen(tail), st.Truncated, "the torn tail is reported")
	assert.Empty(t, st.TornPath, "and not kept aside")
	assert.False(t, st.Clean)
	assert.Equal(t, int64(len(raw)), st.Size)

	ctx := context.Background()
	_, _, err = ro.Append(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bno")) })
	assert.ErrorIs(t, err, ErrReadOnly)
	assert.ErrorIs(t, ro.Writable(), ErrReadOnly)
	assert.ErrorIs(t, ro.Flush(ctx), ErrReadOnly)
	if CanRewrite {
		err = ro.Rewrite(ctx, func(Reader, *Writer) (int64, error) { return 0, nil }, func(move func() int64) { move() })
		assert.ErrorIs(t, err, ErrReadOnly)
	}
	require.NoError(t, ro.View(func(r Reader) error {
		p, err := r.Record(c.offs[1], c.sizes[1], nil)
		assert.Equal(t, "Btwo", string(p))
		return err
	}))
	assert.Equal(t, before, dirState(t, dir), "while open")
	require.NoError(t, ro.Close())
	assert.Equal(t, before, dirState(t, dir), "after Close")

	_, err = Open(filepath.Join(dir, "missing"), &Options{ReadOnly: true}, c.apply)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Equal(t, before, dirState(t, dir), "a missing file is not created")
}

// Opening a file that is not a log this build reads (another program's
// file, a journal of another format version, a damaged header) fails with
// an error saying why, and changes nothing: not the file's bytes, not its
// mode (an input file readable by others stays so), nothing beside it.
// Salvage does not change that: it salvages batches, not other files.
// Checked to fail with the mode tightened before the header is checked.
func TestOpenLeavesForeignFilesAlone(t *testing.T) {
	valid := file(batch(1, rec("Ba")), marker(2))
	rnd := rand.NewChaCha8([32]byte{'w', 'a', 'l'})
	random := make([]byte, 4096)
	_, _ = rnd.Read(random)
	tests := []struct {
		name    string
		give    []byte
		wantErr error
	}{
		{name: "random bytes", give: random, wantErr: ErrNotJournal},
		{name: "random bytes shorter than a header", give: random[:10], wantErr: ErrNotJournal},
		{name: "a text file shorter than a header", give: []byte("hello\n"), wantErr: ErrNotJournal},
		{name: "another program's file", give: cat([]byte("SQLite format 3\x00"), make([]byte, 84)), wantErr: ErrNotJournal},
		{name: "a journal with a damaged magic", give: flip(valid, 3), wantErr: ErrNotJournal},
		{name: "a future format version", give: cat(withVersion(Version+1), valid[FileHeaderLen:]), wantErr: ErrVersion},
		{name: "format version 3", give: cat(withVersion(3), valid[FileHeaderLen:]), wantErr: ErrVersion},
		{name: "a bare header of a future version", give: withVersion(Version + 1), wantErr: ErrVersion},
		{name: "a version 2 header cut short", give: withVersion(2)[:16], wantErr: ErrNotJournal},
		{name: "a header with a bad CRC", give: flip(valid, 21), wantErr: ErrCorrupt},
		{name: "a header with a flipped salt bit", give: flip(valid, 15), wantErr: ErrCorrupt},
	}
	for _, tt := range tests {
		for _, mode := range []struct {
			name string
			opts Options
		}{{"writer", Options{}}, {"salvage", Options{Salvage: true}}, {"read-only", Options{ReadOnly: true}}} {
			opts := mode.opts
			t.Run(tt.name+"/"+mode.name, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "input")
				writeFile(t, path, tt.give, 0o644)
				before := dirState(t, dir)
				l, err := Open(path, &opts, (&collect{}).apply)
				if l != nil {
					_ = l.Close()
				}
				assert.Nil(t, l)
				assert.ErrorIs(t, err, tt.wantErr)
				assert.Equal(t, before, dirState(t, dir), "left as it was")
			})
		}
	}
}

// A torn tail is cut off when a writer opens the log, and kept first,
// byte for byte, in a file beside it named with TornSuffix and the time,
// of mode 0600 (records may hold request bodies): damage to the last
// batches looks the same as a torn write, so it is never just deleted.
// Checked to fail with keepTail's copy removed.
func TestOpenKeepsTornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	l := openLog(t, path, nil)
	appendRecord(t, l, "Bone")
	appendRecord(t, l, "Btwo")
	require.NoError(t, l.Close())
	raw := readUsed(t, path)
	salt, err := CheckFileHeader(raw)
	require.NoError(t, err)
	torn := batch(4, rec("Bthree"))
	SealBatch(torn, 4, int64(len(raw)), salt)
	torn = torn[:len(torn)-1] // the crash cut the write short
	writeFile(t, path, cat(raw, torn), 0o600)

	var c collect
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads)
	st := l.Stats()
	assert.Equal(t, int64(len(torn)), st.Truncated)
	assert.False(t, st.Clean)
	require.True(t, strings.HasPrefix(st.TornPath, path+TornSuffix), "kept beside the log: %q", st.TornPath)
	kept, err := os.ReadFile(st.TornPath)
	require.NoError(t, err)
	assert.Equal(t, torn, kept, "the cut tail, byte for byte")
	fi, err := os.Stat(st.TornPath)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	fi, err = os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, int64(len(raw)), fi.Size(), "cut off on disk")

	appendRecord(t, l, "Bfour")
	require.NoError(t, l.Close())
	c = collect{}
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone", "Btwo", "Bfour"}, c.payloads)
	st = l.Stats()
	assert.Zero(t, st.Truncated)
	assert.Empty(t, st.TornPath)
	assert.True(t, st.Clean)
	require.NoError(t, l.Close())
	assert.Len(t, dirState(t, dir), 2, "the log and one torn file")
}

// Open creates a missing file with mode 0600 and a header of its own
// salt. An empty file, or one holding the start of a header (a crash
// while the log was being created), is a new log too. A log file that
// others may read gets mode 0600: records may hold request bodies. A
// rewrite file left by a crash before its rename is removed: the log
// itself is whole.
func TestOpenCreates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	l := openLog(t, path, nil)
	require.NoError(t, l.Close())
	raw := readUsed(t, path)
	salt, err := CheckFileHeader(raw)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	hdr := FileHeader(salt)
	for n := range FileHeaderLen {
		t.Run(fmt.Sprintf("first %d bytes of a header", n), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			writeFile(t, path, hdr[:n], 0o600)
			l := openLog(t, path, nil)
			appendRecord(t, l, "Bone")
			require.NoError(t, l.Close())
			raw := readUsed(t, path)
			s, err := CheckFileHeader(raw)
			require.NoError(t, err, "the header is written whole")
			assert.NotEqual(t, salt, s, "with a salt of its own")
			_, got := replayFile(t, path)
			assert.Equal(t, []string{"Bone"}, got)
		})
	}

	require.NoError(t, os.Chmod(path, 0o644))
	writeFile(t, path+RewriteSuffix, []byte("a rewrite a crash interrupted"), 0o600)
	l = openLog(t, path, nil)
	require.NoError(t, l.Close())
	fi, err = os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "tightened")
	_, err = os.Stat(path + RewriteSuffix)
	assert.ErrorIs(t, err, os.ErrNotExist, "the leftover rewrite is removed")
}

// A file shorter than a header that holds the start of one, or nothing,
// is a new log whose header a writer has not written yet, or had not
// all written when it crashed: a writer's Open writes the header, and a
// read-only Open (and Replay) sees an empty log, where before it said
// the file was not a journal at all. Checked to fail with replay's
// tornHeader check removed. Other short files are not journals
// (TestOpenLeavesForeignFilesAlone).
func TestOpenReadOnlyTornHeader(t *testing.T) {
	hdr := FileHeader(testSalt)
	for _, n := range []int{0, 1, 8, 12, FileHeaderLen - 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "log")
			writeFile(t, path, hdr[:n], 0o600)
			var c collect
			l, err := Open(path, &Options{ReadOnly: true}, c.apply)
			require.NoError(t, err)
			assert.Empty(t, c.payloads)
			assert.Equal(t, int64(n), l.Stats().Size)
			require.NoError(t, l.View(func(r Reader) error {
				res, err := r.Replay(int64(n), c.apply)
				require.NoError(t, err)
				assert.Equal(t, &Replayed{End: int64(n), Version: Version}, res)
				return nil
			}))
			require.NoError(t, l.Close())

			res, err := Replay(bytes.NewReader(hdr[:n]), int64(n), false, c.apply)
			require.NoError(t, err)
			assert.Equal(t, &Replayed{End: int64(n), Version: Version}, res)

			w := openLog(t, path, nil) // the writer writes the header
			appendRecord(t, w, "Bfirst")
			require.NoError(t, w.Close())
			_, all := replayFile(t, path)
			assert.Equal(t, []string{"Bfirst"}, all)
		})
	}
}

// When the torn tail cannot be kept (its file cannot be created, or the
// copy fails), Open fails and changes nothing: the tail is not cut off,
// and no partial copy is left beside the log; the next Open keeps it and
// cuts it. Checked to fail with the copy's error ignored (the tail is
// then cut off with no copy of it).
func TestOpenKeepTailFails(t *testing.T) {
	for name, create := range map[string]func(string) (File, error){
		"create": func(string) (File, error) { return nil, errors.New("disk full") },
		"copy": func(name string) (File, error) {
			f, err := os.Create(name)
			if err != nil {
				return nil, err
			}
			_ = f.Close()
			return OS{}.OpenFile(name, os.O_RDONLY, 0, false) // read-only: the copy's write fails
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "log")
			l := openLog(t, path, nil)
			appendRecord(t, l, "Bone")
			require.NoError(t, l.Close())
			raw := readUsed(t, path)
			torn := cat(raw, []byte("half a batch"))
			writeFile(t, path, torn, 0o600)
			before := dirState(t, dir)

			// The tests run as root, whom a read-only directory does not
			// stop: the torn tail's file fails through the FS.
			fs := hookFS{open: func(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
				if strings.Contains(name, TornSuffix) {
					return create(name)
				}
				return OS{}.OpenFile(name, flag, perm, dsync)
			}}
			_, err := Open(path, &Options{FS: fs}, (&collect{}).apply)
			require.ErrorContains(t, err, "keep the torn tail")
			assert.Equal(t, before, dirState(t, dir), "nothing changed")

			l = openLog(t, path, nil)
			st := l.Stats()
			assert.Equal(t, int64(len("half a batch")), st.Truncated)
			assert.NotEmpty(t, st.TornPath)
		})
	}
}
