package idemserver_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.RunWithClock(t, func(t *testing.T, now func() time.Time) idemserver.Store {
		return &idemserver.MemoryStore{Now: now}
	})
}

// TestMemoryStoreConformanceWallClock runs the wall-clock flavour of the
// suite, the one Redis and PostgreSQL stores will use, so that it is known
// to pass against a correct store.
func TestMemoryStoreConformanceWallClock(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for real lock timeouts and TTLs")
	}
	t.Parallel()
	storetest.Run(t, func(t *testing.T) idemserver.Store {
		return new(idemserver.MemoryStore)
	})
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestMemoryStorePrune(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	s := &idemserver.MemoryStore{Now: clk.Now}
	claim := func(key string, lock time.Duration) {
		res, err := s.Claim(ctx, key, idemserver.Claim{Token: "t-" + key, Fingerprint: "fp", LockTimeout: lock})
		require.NoError(t, err)
		require.Equal(t, idemserver.Claimed, res.State)
	}
	claim("done-short", time.Minute)
	require.NoError(t, s.Complete(ctx, "done-short", "t-done-short", []byte("record"), time.Hour))
	claim("done-long", time.Minute)
	require.NoError(t, s.Complete(ctx, "done-long", "t-done-long", []byte("record"), 3*time.Hour))
	claim("abandoned", time.Minute)
	claim("running", 5*time.Hour)
	require.Equal(t, 4, s.Len())

	clk.Advance(2 * time.Hour)
	assert.Equal(t, 2, s.Prune(), "the expired response and the abandoned claim")
	assert.Equal(t, 2, s.Len())
	assert.Equal(t, 0, s.Prune(), "nothing left to prune")
}

// TestMemoryStoreSweepsOnClaim checks that expired records are deleted
// without anyone calling Prune: a Claim sweeps its shard once a minute.
func TestMemoryStoreSweepsOnClaim(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	s := &idemserver.MemoryStore{Now: clk.Now}
	claimAll := func(prefix string) {
		for i := range 100 {
			_, err := s.Claim(ctx, fmt.Sprint(prefix, i), idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Second})
			require.NoError(t, err)
		}
	}
	claimAll("old")
	require.Equal(t, 100, s.Len())
	clk.Advance(time.Hour)
	claimAll("new")
	// 100 claims touch most of the 64 shards, and each shard touched
	// first drops its expired records.
	assert.Less(t, s.Len(), 120)
	assert.GreaterOrEqual(t, s.Len(), 100, "the new claims are kept")
}

func TestClaimStateString(t *testing.T) {
	tests := []struct {
		give idemserver.ClaimState
		want string
	}{
		{idemserver.Claimed, "claimed"},
		{idemserver.InProgress, "in progress"},
		{idemserver.Completed, "completed"},
		{idemserver.ClaimState(0), "unknown"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.give.String())
	}
}

// TestMemoryStoreBounds: a full store refuses new claims with ErrStoreFull
// and never evicts a live record; releasing, expiry and completion keep
// the counts right.
func TestMemoryStoreBounds(t *testing.T) {
	ctx := context.Background()
	claim := idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Minute}

	t.Run("entries", func(t *testing.T) {
		clk := newFakeClock()
		s := &idemserver.MemoryStore{Now: clk.Now, MaxEntries: 2, MaxBytes: -1}
		for _, k := range []string{"a", "b"} {
			res, err := s.Claim(ctx, k, claim)
			require.NoError(t, err)
			require.Equal(t, idemserver.Claimed, res.State)
		}
		_, err := s.Claim(ctx, "c", claim)
		assert.ErrorIs(t, err, idemserver.ErrStoreFull)
		res, err := s.Claim(ctx, "a", claim)
		require.NoError(t, err, "a held key is still answered")
		assert.Equal(t, idemserver.InProgress, res.State, "and was not evicted")

		require.NoError(t, s.Release(ctx, "a", "t"))
		res, err = s.Claim(ctx, "c", claim)
		require.NoError(t, err, "a release makes room")
		assert.Equal(t, idemserver.Claimed, res.State)

		clk.Advance(2 * time.Minute) // both claims expire, still counted
		assert.Equal(t, 2, s.Len())
		res, err = s.Claim(ctx, "d", claim)
		require.NoError(t, err, "expired records are swept before refusing")
		assert.Equal(t, idemserver.Claimed, res.State)
	})

	t.Run("bytes", func(t *testing.T) {
		s := &idemserver.MemoryStore{MaxEntries: -1, MaxBytes: 1000}
		_, err := s.Claim(ctx, "a", claim)
		require.NoError(t, err)
		require.NoError(t, s.Complete(ctx, "a", "t", make([]byte, 900), time.Hour), "completion is never refused")
		assert.Greater(t, s.Bytes(), int64(1000))
		_, err = s.Claim(ctx, "b", claim)
		assert.ErrorIs(t, err, idemserver.ErrStoreFull)
	})

	t.Run("accounting", func(t *testing.T) {
		clk := newFakeClock()
		s := &idemserver.MemoryStore{Now: clk.Now}
		for i := range 100 {
			k := fmt.Sprint("k", i)
			_, err := s.Claim(ctx, k, claim)
			require.NoError(t, err)
			switch i % 3 {
			case 0:
				require.NoError(t, s.Release(ctx, k, "t"))
			case 1:
				require.NoError(t, s.Complete(ctx, k, "t", []byte("record"), time.Hour))
			}
		}
		assert.Equal(t, 66, s.Len())
		clk.Advance(2 * time.Hour)
		assert.Equal(t, 66, s.Prune())
		assert.Zero(t, s.Len())
		assert.Zero(t, s.Bytes(), "every byte counted in is counted out")
	})
}

// TestMemoryStoreScopeShare: one principal filling the store with stored
// refusals (400s, kept for the TTL) reaches its share, a quarter of the
// store, and gets 503 for its own new keys; the other principals keep
// being served, and the first is served again once its records expire.
// The empty scope (SingleTenant) has the whole store. (Checked to fail
// without the per-scope bound: once the first principal had filled the
// store, every other got 503 for the TTL.)
func TestMemoryStoreScopeShare(t *testing.T) {
	clk := newFakeClock()
	store := &idemserver.MemoryStore{Now: clk.Now, MaxEntries: 100}
	a := new(app)
	h := (&idemserver.Middleware{Principal: tenantOf, Store: store, TTL: time.Hour, Logger: slog.New(slog.DiscardHandler)}).Wrap(a)
	codes := map[int]int{}
	for i := range 200 {
		codes[serve(h, req{target: "/invalid", key: fmt.Sprint("bad-", i), tenant: "flood"}).Code]++
	}
	assert.Equal(t, map[int]int{http.StatusBadRequest: 25, http.StatusServiceUnavailable: 175}, codes)
	w := serve(h, req{key: "one-more", tenant: "flood"})
	assert.Equal(t, idemserver.TypeStoreFull, problemType(w))
	for _, tenant := range []string{"b", "c", "d"} {
		for i := range 20 {
			assert.Equal(t, http.StatusCreated, serve(h, req{key: fmt.Sprint("k-", i), tenant: tenant}).Code, "tenant %s", tenant)
		}
	}
	clk.Advance(2 * time.Hour)
	assert.Equal(t, http.StatusCreated, serve(h, req{key: "after-ttl", tenant: "flood"}).Code)

	single := &idemserver.MemoryStore{MaxEntries: 100}
	hs := (&idemserver.Middleware{SingleTenant: true, Store: single}).Wrap(a)
	for i := range 100 {
		require.Equal(t, http.StatusCreated, serve(hs, req{key: fmt.Sprint("s-", i)}).Code, "request %d", i)
	}
	assert.Equal(t, http.StatusServiceUnavailable, serve(hs, req{key: "s-full"}).Code)
}

// TestMemoryStoreScopeAccounting: a scope's share is given back as its
// records are released, completed ones expire, or are pruned, so a
// principal is never locked out by records it no longer holds.
func TestMemoryStoreScopeAccounting(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	s := &idemserver.MemoryStore{Now: clk.Now, MaxScopeEntries: 2, MaxScopeBytes: -1}
	claim := func(key string) error {
		_, err := s.Claim(ctx, key, idemserver.Claim{Token: "t-" + key, Fingerprint: "fp", LockTimeout: time.Minute, Scope: "a"})
		return err
	}
	require.NoError(t, claim("1"))
	require.NoError(t, claim("2"))
	assert.ErrorIs(t, claim("3"), idemserver.ErrStoreFull)
	require.NoError(t, s.Release(ctx, "1", "t-1"))
	require.NoError(t, claim("3"))
	require.NoError(t, s.Complete(ctx, "3", "t-3", []byte("record"), time.Hour))
	assert.ErrorIs(t, claim("4"), idemserver.ErrStoreFull)
	clk.Advance(2 * time.Minute) // claim 2 is abandoned; response 3 is live
	require.NoError(t, claim("4"))
	assert.ErrorIs(t, claim("5"), idemserver.ErrStoreFull)
	clk.Advance(2 * time.Hour)
	s.Prune()
	require.NoError(t, claim("5"))
	require.NoError(t, claim("6"))
	_, err := s.Claim(ctx, "other", idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Minute, Scope: "b"})
	assert.NoError(t, err, "another scope has a share of its own")
}
