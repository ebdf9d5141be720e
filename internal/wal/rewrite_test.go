package wal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fillWith is a Rewrite fill that writes one record for each of payloads
// and stands for the old file up to from.
func fillWith(from int64, payloads ...string) func(Reader, *Writer) (int64, error) {
	return func(_ Reader, w *Writer) (int64, error) {
		for _, p := range payloads {
			if _, err := w.Append(RecordHeaderLen+len(p), func(buf []byte) []byte {
				return AppendRecord(buf, []byte(p))
			}); err != nil {
				return 0, err
			}
		}
		return from, nil
	}
}

// justMove is a Rewrite swap with no locks of its own.
func justMove(move func() int64) { move() }

func TestLogRewrite(t *testing.T) {
	if !CanRewrite {
		t.Skip("no rewrite on this platform")
	}
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, nil, (&collect{}).apply)
	require.NoError(t, err)
	appendRecord(t, l, "Bold")
	from := l.Size()
	appendRecord(t, l, "Bkept") // after from: copied as it is
	err = l.Rewrite(context.Background(), func(_ Reader, w *Writer) (int64, error) {
		_, err := w.Append(16, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bnew")) })
		return from, err
	}, func(move func() int64) { move() })
	require.NoError(t, err)
	appendRecord(t, l, "Bafter")
	require.NoError(t, l.Close())
	_, err = os.Stat(path + RewriteSuffix)
	assert.ErrorIs(t, err, os.ErrNotExist)

	var c collect
	l, err = Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bnew", "Bkept", "Bafter"}, c.payloads)
	require.NoError(t, l.Close())
}

// A crash at any point of a rewrite leaves the old file or the new one
// whole at the log's path. Each case fails one step; at that instant the
// test copies what the path holds (what a power cut then would leave,
// given the syncs before it), which must replay without damage to
// exactly the old or the new records. After the failure no temporary file
// is left, and the log goes on with the old file; or, when the directory
// sync after the rename failed, with the new one, but with writes
// stopped, since the rename may not survive a power cut. Checked to fail
// with the rename moved before the new file's sync and the catch-up.
func TestLogRewriteFaults(t *testing.T) {
	if !CanRewrite {
		t.Skip("no rewrite on this platform")
	}
	injected := errors.New("injected crash")
	old := []string{"Bold1", "Bold2", "Bkept"}
	tests := []struct {
		name        string
		step        string // the Fault step that fails; "" for fill itself
		want        []string
		stopsWrites bool
	}{
		{name: "while filling", want: old},
		{name: "catchup", step: "catchup", want: old},
		{name: "syncdir", step: "syncdir", want: []string{"Bnew", "Bkept"}, stopsWrites: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "log")
			var crashed []byte
			crash := func() error {
				var err error
				crashed, err = os.ReadFile(path)
				require.NoError(t, err)
				return injected
			}
			// Rewrite runs the steps on the caller's goroutine; the
			// committer's steps ("write", "sync") are never tt.step.
			l := openLog(t, path, &Options{Fault: func(s string) error {
				if tt.step != "" && s == tt.step {
					return crash()
				}
				return nil
			}})
			appendRecord(t, l, "Bold1")
			appendRecord(t, l, "Bold2")
			from := l.Size()
			appendRecord(t, l, "Bkept")
			before, err := os.ReadFile(path)
			require.NoError(t, err)

			fill := fillWith(from, "Bnew")
			if tt.step == "" {
				fill = func(Reader, *Writer) (int64, error) { return 0, crash() }
			}
			assert.ErrorIs(t, l.Rewrite(context.Background(), fill, justMove), injected)
			require.NotNil(t, crashed, "the step was reached")
			res, c, err := replayBytes(crashed, false)
			require.NoError(t, err, "whole at the crash")
			assert.Zero(t, res.Truncated)
			assert.Equal(t, tt.want, c.payloads, "at the crash")
			_, err = os.Stat(path + RewriteSuffix)
			assert.ErrorIs(t, err, os.ErrNotExist, "no temporary file left")

			if tt.stopsWrites {
				assert.ErrorIs(t, l.Writable(), injected)
				_, _, err := l.Append(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bno")) })
				assert.ErrorIs(t, err, injected)
				assert.ErrorIs(t, l.Close(), injected)
			} else {
				now, err := os.ReadFile(path)
				require.NoError(t, err)
				assert.Equal(t, before, now, "the old file, untouched")
				appendRecord(t, l, "Bafter")
				require.NoError(t, l.Close())
				tt.want = append(tt.want, "Bafter")
			}
			_, got := replayFile(t, path)
			assert.Equal(t, tt.want, got, "reopened")
			assert.Len(t, dirState(t, dir), 1, "nothing beside the log")
		})
	}
}

// Writers are held up only at the very end of a rewrite: a record
// appended and committed while fill runs is copied into the new file
// after fill's records, and one appended just before the switch, in the
// batch being filled, lands where its offset, moved by what move
// returns, says.
func TestLogRewriteCarriesCommitsMadeMeanwhile(t *testing.T) {
	if !CanRewrite {
		t.Skip("no rewrite on this platform")
	}
	path := logPath(t)
	l := openLog(t, path, nil)
	appendRecord(t, l, "Bold")
	from := l.Size()
	fill := func(r Reader, w *Writer) (int64, error) {
		appendRecord(t, l, "Bduring") // a commit while the rewrite runs
		return fillWith(from, "Bnew")(r, w)
	}
	var pending *Batch
	var off, delta int64
	swap := func(move func() int64) {
		// The file is held: this batch waits for the new file.
		var err error
		pending, off, err = l.Append(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bpending")) })
		require.NoError(t, err)
		delta = move()
	}
	require.NoError(t, l.Rewrite(context.Background(), fill, swap))
	<-pending.Done()
	require.NoError(t, pending.Err())
	require.NoError(t, l.View(func(r Reader) error {
		p, err := r.Record(off+delta, len(rec("Bpending")), nil)
		assert.Equal(t, "Bpending", string(p), "at its moved offset")
		return err
	}))
	assert.Equal(t, uint64(1), l.Stats().Rewrites)
	require.NoError(t, l.Close())
	res, got := replayFile(t, path)
	assert.Equal(t, []string{"Bnew", "Bduring", "Bpending"}, got)
	assert.True(t, res.Clean)
}

// A log opened through a symbolic link stays behind it: a rewrite
// replaces the link's target, not the link.
func TestLogRewriteKeepsSymlink(t *testing.T) {
	if !CanRewrite {
		t.Skip("no rewrite on this platform")
	}
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "data"), 0o700))
	target := filepath.Join(dir, "data", "log")
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(target, link))
	l := openLog(t, link, nil)
	appendRecord(t, l, "Bold")
	require.NoError(t, l.Rewrite(context.Background(), fillWith(l.Size(), "Bnew"), justMove))
	appendRecord(t, l, "Bafter")
	require.NoError(t, l.Close())

	fi, err := os.Lstat(link)
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&os.ModeSymlink, "still a link")
	dest, err := os.Readlink(link)
	require.NoError(t, err)
	assert.Equal(t, target, dest)
	_, got := replayFile(t, target)
	assert.Equal(t, []string{"Bnew", "Bafter"}, got)
	assert.Len(t, dirState(t, filepath.Join(dir, "data")), 1, "nothing beside the target")
}
