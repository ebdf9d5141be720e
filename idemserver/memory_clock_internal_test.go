package idemserver

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMemoryStorePrunesAfterAClockSetBack: a full store whose clock was
// set back sweeps every shard for records claimed after the set-back once
// they expire, rather than answering ErrStoreFull until the clock passes
// the gate it set before the jump (a second after the last sweep, on the
// old reading). Checked to fail with mayPrune reduced to now >= next:
// ErrStoreFull for the hour the clock went back.
func TestMemoryStorePrunesAfterAClockSetBack(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	s := &MemoryStore{Now: func() time.Time { return now }, MaxEntries: 2, MaxScopeEntries: -1, MaxScopeBytes: -1}
	claim := func(key string) error {
		_, err := s.Claim(ctx, key, Claim{Token: "t-" + key, Fingerprint: "fp", LockTimeout: time.Minute})
		return err
	}
	// Keys in three distinct shards, so that no shard's own sweep frees
	// another's records: only the store-wide prune does.
	var keys []string
	seen := map[uint32]bool{}
	for i := 0; len(keys) < 5; i++ {
		k := fmt.Sprint("k", i)
		if sh := hashString(k) % memShards; !seen[sh] {
			seen[sh] = true
			keys = append(keys, k)
		}
	}
	require.NoError(t, claim(keys[0]))
	require.NoError(t, claim(keys[1]))
	require.ErrorIs(t, claim(keys[2]), ErrStoreFull) // a sweep ran: the gate is now+1s
	require.NoError(t, s.Release(ctx, keys[0], "t-"+keys[0]))
	require.NoError(t, s.Release(ctx, keys[1], "t-"+keys[1]))

	now = now.Add(-time.Hour) // the clock is set back
	require.NoError(t, claim(keys[2]))
	require.NoError(t, claim(keys[3]))
	now = now.Add(2 * time.Minute) // both claims are abandoned
	require.NoError(t, claim(keys[4]), "a full store of expired records sweeps them after a set-back")
}
