package postgres_test

import (
	"context"
	"github.com/idemkit/idemhttp/internal/storeharness"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// TestMiddlewareInstancesShareStore runs 200 requests with one key across
// four middleware instances (as four processes of one service would be),
// each with its own pool, sharing the store's table: the effect runs once.
func TestMiddlewareInstancesShareStore(t *testing.T) {
	s := newSchema(t)
	e := storeharness.NewEffects()
	servers := make([]*httptest.Server, 4)
	for i := range servers {
		servers[i] = storeharness.Serve(t, newStore(t, s.pool(t, 8)), e, time.Minute, nil)
	}
	storeharness.SharedKeyRace(t, servers, e, 200)
}

// TestPrune checks that Prune deletes expired claims and responses, and
// only those.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	store := newStore(t, pool)
	claim := func(key string, lock time.Duration) {
		t.Helper()
		res, err := store.Claim(ctx, key, idemserver.Claim{Token: "t-" + key, Fingerprint: "fp", LockTimeout: lock})
		require.NoError(t, err)
		require.Equal(t, idemserver.Claimed, res.State, key)
	}
	complete := func(key string, ttl time.Duration) {
		t.Helper()
		require.NoError(t, store.Complete(ctx, key, "t-"+key, []byte("record"), ttl), key)
	}
	// A microsecond has passed by the time the next statement runs.
	claim("claim-expired", time.Microsecond)
	claim("claim-live", time.Hour)
	claim("done-expired", time.Hour)
	complete("done-expired", time.Microsecond)
	claim("done-live", time.Hour)
	complete("done-live", time.Hour)

	n, err := store.Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	var keys []string
	rows, err := pool.Query(ctx, "SELECT convert_from(key, 'UTF8') FROM idemhttp_keys ORDER BY key")
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"claim-live", "done-live"}, keys)

	n, err = store.Prune(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "a second prune finds nothing")
}

// TestPruneChunks checks that Prune deletes more rows than one chunk.
func TestPruneChunks(t *testing.T) {
	ctx := context.Background()
	pool := newSchema(t).pool(t, 0)
	_, err := pool.Exec(ctx, `
INSERT INTO idemhttp_keys (key, token, fingerprint, record, expires_at)
SELECT convert_to('k' || i, 'UTF8'), 't', 'fp', 'r', now() - interval '1 second'
FROM generate_series(1, 12001) i`)
	require.NoError(t, err)
	n, err := newStore(t, pool).Prune(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(12001), n)
}

// TestClaimRecognisesOwnToken pins what makes resending a Claim after a
// dead connection safe: finding its own token, the Claim reports Claimed
// rather than leaving its own request waiting for 409s.
func TestClaimRecognisesOwnToken(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, newSchema(t).pool(t, 0))
	claim := idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Minute}
	for range 2 {
		res, err := store.Claim(ctx, "k", claim)
		require.NoError(t, err)
		assert.Equal(t, idemserver.ClaimResult{State: idemserver.Claimed}, res)
	}
	require.NoError(t, store.Complete(ctx, "k", "t1", []byte("r"), time.Minute))
}

// TestMigrateConcurrently runs Migrate from many goroutines at once on a
// new schema, as a fleet starting together would: the advisory lock keeps
// the catalog's unique indexes from failing any of them.
func TestMigrateConcurrently(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	admin := s.admin(t)
	_, err := admin.Exec(ctx, "DROP TABLE "+s.name+".idemhttp_keys, "+s.name+".idemhttp_journal")
	require.NoError(t, err)
	pool := s.pool(t, 8)
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- postgres.Migrate(ctx, pool) }()
	}
	for range 8 {
		assert.NoError(t, <-errs)
	}
	assert.Contains(t, postgres.Schema(), "CREATE TABLE IF NOT EXISTS idemhttp_keys")
}
