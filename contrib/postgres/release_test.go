package postgres_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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

// A worker that sends only some of a shared journal's entries (those of
// its own batch) hands the others back unchanged, at once, and does not
// claim them again ahead of its own.
func ExampleJournal_ClaimPendingExcept() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Lease: 2 * time.Minute})
	mine := func(e *idemhttp.Entry) bool { return strings.HasPrefix(e.Operation, "invoice-2024-") }
	var others []string
	for {
		entries, err := j.ClaimPendingExcept(ctx, 16, others)
		if err != nil {
			log.Fatal(err)
		}
		if len(entries) == 0 {
			return // none free: the rest are others', or held
		}
		for _, e := range entries {
			if !mine(e) {
				others = append(others, e.Key)
				if err := j.Release(ctx, e.Key); err != nil { // no lease kept, nothing changed
					log.Fatal(err)
				}
				continue
			}
			// Send e with its key and operation (see ExampleJournal_ClaimPending).
		}
	}
}
