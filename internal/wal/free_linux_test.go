package wal

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// freeLog returns a log at a new path holding a few records, and the
// size of its file.
func freeLog(t *testing.T) (*Log, string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, nil, (&collect{}).apply)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	for _, p := range []string{"Bone", "Btwo", "Bthree"} {
		appendRecord(t, l, p)
	}
	return l, path, l.Size()
}

// A file a rewrite replaced that nobody reads is freed by truncation, a
// step at a time, before it is closed (seen through a descriptor that
// holds no viewer lock). With freeReplaced only closing the file, it
// keeps its size (checked).
func TestRewriteFreesTheReplacedFile(t *testing.T) {
	l, path, size := freeLog(t)
	plain, err := os.Open(path)
	require.NoError(t, err)
	defer plain.Close()
	require.NoError(t, l.Rewrite(context.Background(), fillWith(size, "Bone"), justMove))
	fi, err := plain.Stat()
	require.NoError(t, err)
	assert.Zero(t, fi.Size(), "the replaced file, truncated")
}

// A read-only open still reads the file it opened after a writer replaced
// it: the writer sees its viewer lock and leaves the file whole. With the
// writer ignoring the lock, the viewer's file is truncated under it and
// its read fails (checked).
func TestRewriteLeavesTheReplacedFileToAViewer(t *testing.T) {
	l, path, size := freeLog(t)
	var c collect
	viewer, err := Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	defer viewer.Close()
	require.Len(t, c.payloads, 3)
	before, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, l.Rewrite(context.Background(), fillWith(size, "Bone"), justMove))
	require.NoError(t, viewer.View(func(r Reader) error {
		fi, err := r.l.f.Stat()
		require.NoError(t, err)
		assert.Equal(t, before.Size(), fi.Size(), "the viewer's file, whole")
		p, err := r.Record(FileHeaderLen+BatchHeaderLen, RecordHeaderLen+4, nil)
		require.NoError(t, err)
		assert.Equal(t, "Bone", string(p))
		return nil
	}))
}

// A read-only open that races a rewrite, opening the old file just
// before the rename and taking its lock while the writer frees it, is
// refused the lock and opens the path again: the new file. (With
// openViewer taking a refused lock as an error, it fails; checked.)
func TestOpenViewerSkipsAFileBeingFreed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o600))
	require.NoError(t, os.Link(path, path+".old"))  // to open the old file after the rename
	freeing, err := os.OpenFile(path, os.O_RDWR, 0) // a write lock needs a descriptor open for writing
	require.NoError(t, err)
	defer freeing.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: viewerByte, Len: 1}
	require.NoError(t, unix.FcntlFlock(freeing.Fd(), unix.F_OFD_SETLK, &lk), "the writer's lock, as freeReplaced takes it")
	other, err := os.Open(path)
	require.NoError(t, err)
	require.ErrorIs(t, lockViewer(other), ErrLocked, "another descriptor of the file being freed")
	require.NoError(t, other.Close())
	require.NoError(t, os.WriteFile(path+".new", []byte("new"), 0o600))
	require.NoError(t, os.Rename(path+".new", path))

	var opened []string
	fs := hookFS{open: func(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
		opened = append(opened, name)
		if len(opened) == 1 {
			name = path + ".old" // what the path named a moment ago
		}
		return OS{}.OpenFile(name, flag, perm, dsync)
	}}
	f, fi, err := openViewer(fs, path)
	require.NoError(t, err)
	defer f.Close()
	now, err := os.Stat(path)
	require.NoError(t, err)
	assert.True(t, os.SameFile(fi, now), "the new file")
	assert.Len(t, opened, 2, "opened again after the refused lock")
}
