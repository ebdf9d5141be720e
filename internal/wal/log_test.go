package wal

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// collect is an ApplyFunc that keeps every record it is given.
type collect struct {
	payloads []string
	offs     []int64
	sizes    []int
}

func (c *collect) apply(off int64, n int, p []byte) error {
	c.payloads = append(c.payloads, string(p))
	c.offs = append(c.offs, off)
	c.sizes = append(c.sizes, n)
	return nil
}

// appendRecord appends one record holding payload and waits for it.
func appendRecord(t *testing.T, l *Log, payload string) {
	t.Helper()
	b, _, err := l.Append(RecordHeaderLen+len(payload), 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte(payload))
	})
	require.NoError(t, err)
	<-b.Done()
	require.NoError(t, b.Err())
}

func TestLogAppendReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, nil, (&collect{}).apply)
	require.NoError(t, err)
	appendRecord(t, l, "Bone")
	appendRecord(t, l, "Btwo")
	require.NoError(t, l.Close())
	assert.ErrorIs(t, l.Flush(context.Background()), ErrClosed)

	var c collect
	l, err = Open(path, nil, c.apply)
	require.NoError(t, err)
	assert.Equal(t, []string{"Bone", "Btwo"}, c.payloads, "the close marker is not a record")
	assert.True(t, l.Stats().Clean)
	require.NoError(t, l.Close())
}

// A commit that others wait on is published (OnCommit) before they wake.
func TestLogOnCommitBeforeWake(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	published := make(map[*Batch]bool)
	l, err := Open(path, &Options{OnCommit: func(b *Batch, err error) {
		published[b] = err == nil
	}}, (&collect{}).apply)
	require.NoError(t, err)
	b, _, err := l.Append(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bx")) })
	require.NoError(t, err)
	<-b.Done()
	assert.True(t, published[b])
	require.NoError(t, l.Close())
}

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
