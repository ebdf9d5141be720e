package wal

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// appendLazy appends one lazy record holding payload and returns its
// batch, without waiting for it.
func appendLazy(t *testing.T, l *Log, payload string) *Batch {
	t.Helper()
	b, _, err := l.AppendLazy(RecordHeaderLen+len(payload), 1, func(buf []byte) []byte {
		return AppendRecord(buf, []byte(payload))
	})
	require.NoError(t, err)
	return b
}

// waitBatch waits for b with a deadline far beyond any lazy delay a test
// here sets, and returns its error.
func waitBatch(t *testing.T, b *Batch) error {
	t.Helper()
	select {
	case <-b.Done():
		return b.Err()
	case <-time.After(30 * time.Second):
		require.FailNow(t, "the batch was not committed")
		return nil
	}
}

// replayed opens the log at path read-only and returns its records.
func replayed(t *testing.T, path string) []string {
	t.Helper()
	var c collect
	l, err := Open(path, &Options{ReadOnly: true}, c.apply)
	require.NoError(t, err)
	require.NoError(t, l.Close())
	return c.payloads
}

// A lazy record starts no commit: it goes with the next record someone
// waits for. With a delay no test outlives, the count is exact: a lone
// caller alternating a waited-for and a lazy record pays one commit per
// pair. Between the two, the caller reads the file (its own work between
// requests), time in which a committer woken by the lazy record would
// commit it alone. Checked to fail with AppendLazy waking the committer
// as Append does: no lazy record found waiting, in every run; 51 to 68
// commits for 50 pairs over four runs (the count alone is a matter of
// scheduling, so the flag is what bites every time).
func TestLogLazyRidesWithTheNextCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, &Options{LazyDelay: time.Hour}, (&collect{}).apply)
	require.NoError(t, err)
	const n = 50
	armed := 0
	for range n {
		appendRecord(t, l, "Bbegin") // would wait an hour if it did not start the commit
		appendLazy(t, l, "Bfinish")
		l.mu.Lock()
		if l.lazyArmed {
			armed++ // waits for company or its timer
		}
		l.mu.Unlock()
		_, err := os.ReadFile(path)
		require.NoError(t, err)
	}
	assert.Equal(t, n, armed, "every lazy record waited")
	assert.Equal(t, uint64(n), l.Stats().Commits, "one commit per pair")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, l.Flush(ctx), "Flush takes the lazy batch at once")
	assert.Equal(t, uint64(n+1), l.Stats().Commits)
	l.mu.Lock()
	assert.False(t, l.lazyArmed, "sealing the batch stopped its timer")
	l.mu.Unlock()
	require.NoError(t, l.Close())
	assert.Len(t, replayed(t, path), 2*n)
}

// A lazy record nobody follows is committed once the delay has passed,
// and not before. Checked to fail (the batch is never committed) with
// the timer not armed, as do the two tests below.
func TestLogLazyCommittedAfterTheDelay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	const delay = 20 * time.Millisecond
	l, err := Open(path, &Options{LazyDelay: delay}, (&collect{}).apply)
	require.NoError(t, err)
	start := time.Now()
	b := appendLazy(t, l, "Blone")
	require.NoError(t, waitBatch(t, b))
	assert.GreaterOrEqual(t, time.Since(start), delay, "committed by the timer, not at once")
	assert.Equal(t, uint64(1), l.Stats().Commits)
	assert.Equal(t, []string{"Blone"}, replayed(t, path), "on disk while the log is still open")
	require.NoError(t, l.Close())
}

// A negative delay turns lazy records into ordinary ones.
func TestLogLazyNegativeDelayCommitsAtOnce(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "log"), &Options{LazyDelay: -1}, (&collect{}).apply)
	require.NoError(t, err)
	b := appendLazy(t, l, "Bnow")
	require.NoError(t, waitBatch(t, b))
	require.NoError(t, l.Close())
}

// Close writes a pending lazy batch, whatever the delay. Checked to fail
// with Close's last commits not forced. (Flush is checked the same way,
// in TestLogLazyRidesWithTheNextCommit.)
func TestLogLazyWrittenByClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	l, err := Open(path, &Options{LazyDelay: time.Hour}, (&collect{}).apply)
	require.NoError(t, err)
	appendRecord(t, l, "Bbegin")
	b := appendLazy(t, l, "Bfinish")
	require.NoError(t, l.Close())
	require.NoError(t, waitBatch(t, b))
	assert.Equal(t, []string{"Bbegin", "Bfinish"}, replayed(t, path))
	assert.Equal(t, uint64(2+1), l.Stats().Commits, "the lazy batch, then the close marker")
}

// A lazy batch whose timed commit fails breaks the log like any other
// failed commit: later writes stop, and Close reports it.
func TestLogLazyTimedCommitFails(t *testing.T) {
	injected := errors.New("injected write failure")
	l, err := Open(filepath.Join(t.TempDir(), "log"), &Options{
		LazyDelay: time.Millisecond,
		Fault: func(step string) error {
			if step == "write" {
				return injected
			}
			return nil
		},
	}, (&collect{}).apply)
	require.NoError(t, err)
	b := appendLazy(t, l, "Blost")
	assert.ErrorIs(t, waitBatch(t, b), injected)
	assert.ErrorIs(t, l.Writable(), injected)
	_, _, err = l.AppendLazy(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bno")) })
	assert.ErrorIs(t, err, injected)
	assert.ErrorIs(t, l.Close(), injected)
}

// A lazy batch pending while a rewrite holds the file for its last round
// and switches files: its commit waits for the switch and lands in the
// new file, at its moved offset. The record is appended from the fault
// hook that runs with the file held exclusively; with a 1 µs delay its
// timer fires during the hold, or just after (both orders must give the
// same file).
func TestLogLazyAcrossRewrite(t *testing.T) {
	if !CanRewrite {
		t.Skip("no rewrite on this platform")
	}
	path := filepath.Join(t.TempDir(), "log")
	var l *Log
	var lazy *Batch
	l, err := Open(path, &Options{
		LazyDelay: time.Microsecond,
		Fault: func(step string) error {
			if step == "syncdir" {
				b, _, err := l.AppendLazy(16, 1, func(buf []byte) []byte { return AppendRecord(buf, []byte("Blazy")) })
				lazy = b
				return err
			}
			return nil
		},
	}, (&collect{}).apply)
	require.NoError(t, err)
	appendRecord(t, l, "Bold")
	from := l.Size()
	appendRecord(t, l, "Bkept")
	err = l.Rewrite(context.Background(), func(_ Reader, w *Writer) (int64, error) {
		_, err := w.Append(16, func(buf []byte) []byte { return AppendRecord(buf, []byte("Bnew")) })
		return from, err
	}, func(move func() int64) { move() })
	require.NoError(t, err)
	require.NotNil(t, lazy)
	require.NoError(t, waitBatch(t, lazy))
	require.NoError(t, l.Close())
	assert.Equal(t, []string{"Bnew", "Bkept", "Blazy"}, replayed(t, path))
}
