package idemserver

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRenewalStartStopRace starts and stops renewals, from several
// goroutines, at every phase of the shared timer (before it fires, while
// a renewal runs, after it re-arms) under the race detector; goleak, in
// TestMain, checks that no renewal goroutine is left.
func TestRenewalStartStopRace(t *testing.T) {
	ctx := context.Background()
	store := new(MemoryStore)
	h := (&Middleware{SingleTenant: true, Store: store, LockTimeout: 3 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}).build(nil)
	res, err := store.Claim(ctx, "k", Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Hour})
	require.NoError(t, err)
	require.Equal(t, Claimed, res.State)
	// Eight requests at a time share the handler's renewer.
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				var rn renewal
				rn.start(ctx, h, "k", "k", "t", time.Now())
				// Varied lifetimes, to stop renewals in each phase of
				// the timer; the wait orders nothing.
				<-time.After(time.Duration((i+g)%4) * time.Millisecond)
				rn.stop()
				rn.stop() // twice is harmless
			}
		}()
	}
	wg.Wait()
	var idle renewal
	idle.stop() // never started
}
