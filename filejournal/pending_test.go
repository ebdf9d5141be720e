package filejournal

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countPending counts the pending entries of j's index by scanning it: what
// PendingCount must always equal.
func countPending(j *Journal) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	n := 0
	for _, le := range ijMap(j.byKey) {
		if le.state == journalStatePending {
			n++
		}
	}
	return n
}

// PendingCount is kept by the journal's state changes; a random mix of
// begins, outcomes (to every state; a final one refuses another), deletes and
// prunes, and a reopen, must keep it equal to a scan of the index. (Checked
// to fail with the decrement in unindexLocked removed.)
func TestFileJournalPendingCount(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "j")
	j, err := Open(path, nil)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	var keys []string
	states := []idemhttp.State{idemhttp.StatePending, idemhttp.StateDone, idemhttp.StateAbandoned}
	for i := range 300 {
		switch op := rng.IntN(10); {
		case op < 4 || len(keys) == 0:
			k := fmt.Sprintf("key-%d", i)
			_, err := j.Begin(ctx, ijEntry(k, ""))
			require.NoError(t, err)
			keys = append(keys, k)
		case op < 8:
			k := keys[rng.IntN(len(keys))]
			if err := j.Finish(ctx, k, idemhttp.Outcome{State: states[rng.IntN(3)], Status: 200, Attempts: 1, At: time.Now()}); err != nil {
				require.ErrorIs(t, err, idemhttp.ErrFenced, "only a final entry refuses an outcome")
			}
		case op < 9:
			i := rng.IntN(len(keys))
			require.NoError(t, j.forceDelete(ctx, keys[i]))
			keys = append(keys[:i], keys[i+1:]...)
		default:
			_, err := j.Prune(ctx, time.Now().Add(time.Hour))
			require.NoError(t, err)
			keys = keys[:0]
			for k := range j.byKeySnapshot() {
				keys = append(keys, k)
			}
		}
		require.Equal(t, countPending(j), j.PendingCount(), "after step %d", i)
	}
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Len(t, pending, j.PendingCount(), "every Begin is durable now")
	want := j.PendingCount()
	require.NoError(t, j.Close())

	j, err = Open(path, nil)
	require.NoError(t, err)
	defer j.Close()
	assert.Equal(t, want, j.PendingCount(), "counted again at open")
	c := &idemhttp.Client{Journal: j}
	assert.Equal(t, want, c.Stats().JournalPending)
}

// byKeySnapshot returns the keys in j's index.
func (j *Journal) byKeySnapshot() map[string]bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	m := make(map[string]bool, j.byKey.len())
	for k := range ijMap(j.byKey) {
		m[k] = true
	}
	return m
}
