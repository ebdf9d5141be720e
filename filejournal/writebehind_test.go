package filejournal

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
)

// wbOpen opens a journal whose Finish records wait up to writeBehind for
// company (zero: the default), closed when the test ends.
func wbOpen(t *testing.T, writeBehind time.Duration) (*Journal, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, &Options{writeBehind: writeBehind})
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j, path
}

// wbState is key's state in the file, as a read-only journal opened now
// sees it: what is on disk (or at least written), not what the writer's
// index holds.
func wbState(t *testing.T, path, key string) idemhttp.State {
	t.Helper()
	r, err := Open(path, &Options{ReadOnly: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	e, err := r.Get(context.Background(), key)
	require.NoError(t, err)
	return e.State
}

// wbWithin runs fn and fails the test if it does not return within a
// deadline far beyond any wait it should have: with the bound set to an
// hour, a write that waited for it would hang.
func wbWithin(t *testing.T, what string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(30 * time.Second):
		require.FailNow(t, what+" waited for the write-behind bound")
	}
}

// A lone caller's request costs one commit: Finish's record starts none
// and goes with the next Begin's. With the bound at an hour the count is
// exact, whatever the machine's load. Between requests the caller reads
// its entry back (its own work), time in which a committer woken by
// Finish would commit the record alone. Checked to fail with Finish
// appending as Begin does: 128 to 147 commits for 100 requests over
// three runs (the count is then a matter of scheduling; the deterministic
// check of the same mechanism is wal's TestLogLazyRidesWithTheNextCommit).
func TestJournalWriteBehindOneSyncPerRequest(t *testing.T) {
	j, path := wbOpen(t, time.Hour)
	ctx := context.Background()
	const n = 100
	before := j.Stats().Commits
	wbWithin(t, "the requests", func() error {
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			if _, err := j.Begin(ctx, ijEntry(key, "")); err != nil {
				return err
			}
			if err := j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}); err != nil {
				return err
			}
			if _, err := j.Get(ctx, key); err != nil {
				return err
			}
		}
		return nil
	})
	assert.Equal(t, uint64(n), j.Stats().Commits-before, "one commit per request")
	assert.Equal(t, idemhttp.StateDone, wbState(t, path, "k98"), "each Finish went with the next Begin")
	assert.Equal(t, idemhttp.StatePending, wbState(t, path, "k99"), "the last one waits")
}

// A Finish with no write after it reaches the disk by itself, once the
// bound has passed (and not before: it was not committed at once).
// Checked to fail (never committed) with the timer not armed.
func TestJournalWriteBehindLoneFinishReachesDisk(t *testing.T) {
	j, path := wbOpen(t, 0)
	ctx := context.Background()
	_, err := j.Begin(ctx, ijEntry("a", ""))
	require.NoError(t, err)
	before := j.Stats().Commits
	start := time.Now()
	require.NoError(t, j.Finish(ctx, "a", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
	require.Eventually(t, func() bool { return j.Stats().Commits > before }, 10*time.Second, time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), WriteBehind, "written by the bound's timer")
	assert.Equal(t, idemhttp.StateDone, wbState(t, path, "a"), "in the file while the journal is open")
}

// Every write someone waits for takes the outcomes written behind with
// it: Sync, Close, a Begin, Delete and Prune return only once they are on
// disk, without waiting for the bound (an hour here). Checked to fail
// (each but close hangs until the deadline) with Flush not marking the
// batch waited for and Append waking the committer only for an empty
// batch, as before lazy records. Close forces the commit; wal's
// TestLogLazyWrittenByClose is the one that fails without that.
func TestJournalWriteBehindWrittenBy(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		give string
		do   func(j *Journal) error
	}{
		{give: "sync", do: func(j *Journal) error { return j.Sync(ctx) }},
		{give: "close", do: func(j *Journal) error { return j.Close() }},
		{give: "begin", do: func(j *Journal) error {
			_, err := j.Begin(ctx, ijEntry("next", ""))
			return err
		}},
		{give: "delete", do: func(j *Journal) error { return j.forceDelete(ctx, "other") }},
		{give: "prune", do: func(j *Journal) error {
			n, err := j.Prune(ctx, time.Now().Add(time.Hour))
			if err == nil && n != 2 {
				err = fmt.Errorf("pruned %d, want 2", n)
			}
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			j, path := wbOpen(t, time.Hour)
			_, err := j.Begin(ctx, ijEntry("other", ""))
			require.NoError(t, err)
			_, err = j.Begin(ctx, ijEntry("a", ""))
			require.NoError(t, err)
			require.NoError(t, j.Finish(ctx, "other", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
			require.NoError(t, j.Finish(ctx, "a", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
			require.Equal(t, idemhttp.StatePending, wbState(t, path, "a"), "precondition: written behind")

			wbWithin(t, tt.give, func() error { return tt.do(j) })
			if tt.give != "prune" {
				assert.Equal(t, idemhttp.StateDone, wbState(t, path, "a"))
			}
		})
	}
}

// A Finish written behind while a compaction runs: the compacted file
// takes the entry's state from the index (done), and the finish record,
// still in the batch being filled, moves to the new file with it and is
// committed there later. Replaying both gives the same entry: attempts
// are stored as a total, so the record is not counted twice. Checked to
// fail (the reopen finds damage) with the rewrite not moving the offset
// of the batch being filled.
func TestJournalWriteBehindAcrossCompact(t *testing.T) {
	if !wal.CanRewrite {
		t.Skip("no compaction on this platform")
	}
	j, path := wbOpen(t, time.Hour)
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		_, err := j.Begin(ctx, ijEntry(k, ""))
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "a", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 2}))
	require.Equal(t, idemhttp.StatePending, wbState(t, path, "a"), "precondition: written behind")
	require.NoError(t, j.Compact(ctx))
	assert.Equal(t, idemhttp.StateDone, wbState(t, path, "a"), "the compacted file has the index's state")
	assert.Equal(t, uint64(1), j.Stats().Compactions)
	wbWithin(t, "a Begin after the compaction", func() error {
		_, err := j.Begin(ctx, ijEntry("c", ""))
		return err
	})
	require.NoError(t, j.Close())

	r := ijReopen(t, path)
	assert.NoError(t, r.Verify(ctx))
	e, err := r.Get(ctx, "a")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, e.State)
	assert.Equal(t, 2, e.Attempts)
	assert.Equal(t, 201, e.LastStatus)
}
