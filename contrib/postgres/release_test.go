package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// Issue 31 §1.10: a worker hands back an entry it claimed and will not
// send (another batch's) with Release, which ends the lease and changes
// nothing else: another worker claims it at once, and its last status and
// attempts stay as they were; ClaimPendingExcept then skips it, so the
// worker reaches its own entries instead of claiming it again. Checked to
// fail with Release as a Finish(pending) (what idemctl did): the entry
// stayed leased to the first worker, and its last status became 0.
func TestReleaseHandsBackUnchanged(t *testing.T) {
	ctx := context.Background()
	pool := newSchema(t).pool(t, 4)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "a", Lease: time.Hour})
	b := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "b", Lease: time.Hour})
	for i := range 3 {
		key := fmt.Sprintf("k-%d", i)
		_, err := a.Enqueue(ctx, &idemhttp.Entry{Operation: "op-" + key, Key: key, Method: "POST", URL: "https://api.test/v1", Fingerprint: "fp", State: idemhttp.StatePending})
		require.NoError(t, err)
		// An earlier run's attempt: a 503, then nothing.
		require.NoError(t, a.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 1}))
	}

	claimed, err := a.ClaimPending(ctx, 1)
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	foreign := claimed[0].Key
	require.NoError(t, a.Release(ctx, foreign))

	again, err := a.ClaimPendingExcept(ctx, 3, []string{foreign})
	require.NoError(t, err)
	require.Len(t, again, 2, "the others, and not the one handed back")
	for _, e := range again {
		assert.NotEqual(t, foreign, e.Key)
	}

	got, err := b.ClaimPending(ctx, 3)
	require.NoError(t, err, "another worker claims it at once")
	require.Len(t, got, 1)
	assert.Equal(t, foreign, got[0].Key)
	e, err := b.Get(ctx, foreign)
	require.NoError(t, err)
	assert.Equal(t, 503, e.LastStatus, "its last status kept")
	assert.Equal(t, 1, e.Attempts)
	assert.Equal(t, idemhttp.StatePending, e.State)

	assert.NoError(t, a.Release(ctx, foreign), "no longer a's: nothing to hand back")
	assert.ErrorIs(t, a.Release(ctx, "no-such-key"), idemhttp.ErrNotFound)
}
