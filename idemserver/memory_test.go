package idemserver_test

import (
	"context"
	"fmt"
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
