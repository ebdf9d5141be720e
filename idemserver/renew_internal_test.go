package idemserver

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRenewalStartStopRace starts and stops renewals at every phase of
// their timer (before it fires, while its function runs, after it re-arms)
// under the race detector; goleak, in TestMain, checks that no timer
// goroutine is left.
func TestRenewalStartStopRace(t *testing.T) {
	ctx := context.Background()
	store := new(MemoryStore)
	h := (&Middleware{SingleTenant: true, Store: store, LockTimeout: 3 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}).build(nil)
	res, err := store.Claim(ctx, "k", Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Hour})
	require.NoError(t, err)
	require.Equal(t, Claimed, res.State)
	for i := range 200 {
		var rn renewal
		rn.start(ctx, h, "k", "t")
		// Varied lifetimes, to stop the timer in each of its phases; the
		// wait orders nothing.
		<-time.After(time.Duration(i%4) * time.Millisecond)
		rn.stop()
		rn.stop() // twice is harmless
	}
	var idle renewal
	idle.stop() // never started
}
