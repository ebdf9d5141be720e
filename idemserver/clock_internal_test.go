package idemserver

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSteadyClockCarriesOnAfterASetBack pins the clock the simulator's
// seam gives the renewer (internal/serverclock): a reading earlier than
// the latest carries on from the latest, so a set-back holds no renewal
// back, and time then runs on from there.
// Checked to fail with the idemhttp_bug_clockback build tag (the
// reading returned unguarded).
func TestSteadyClockCarriesOnAfterASetBack(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var off atomic.Int64
	c := newSteadyClock(func() time.Time { return base.Add(time.Duration(off.Load())) })
	assert.Equal(t, base, c.now())
	off.Store(int64(2 * time.Second))
	assert.Equal(t, base.Add(2*time.Second), c.now())
	off.Store(int64(-time.Hour)) // set back an hour
	assert.Equal(t, base.Add(2*time.Second), c.now(), "a set-back carries on from the latest reading")
	off.Store(int64(-time.Hour + time.Second)) // a second passes
	assert.Equal(t, base.Add(3*time.Second), c.now(), "and time runs on from there")
	off.Store(int64(time.Minute)) // set forward: time passing, to the clock
	assert.Equal(t, base.Add(time.Minute+time.Hour+2*time.Second), c.now())
}

// TestStoreDeadlineOnTheProcessClock: a store call's deadline is the time
// left on the process's clock, not a reading of it that the runtime
// measures on its own: with a clock an hour behind the runtime's, a
// claim's call still gets the lock timeout.
// Checked to fail with the idemhttp_bug_procdeadline build tag
// (context.WithDeadline(ctx, until)).
func TestStoreDeadlineOnTheProcessClock(t *testing.T) {
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	h := (&Middleware{SingleTenant: true, Store: nonMemoryStore{new(MemoryStore)}, LockTimeout: time.Minute, now: behind}).build(http.NotFoundHandler())
	ctx, cancel := h.bounded(context.Background(), h.renewer.clock.now().Add(time.Minute))
	defer cancel()
	dl, ok := ctx.Deadline()
	assert.True(t, ok)
	assert.InDelta(t, time.Minute.Seconds(), time.Until(dl).Seconds(), 5)
	assert.NoError(t, ctx.Err())
}

// nonMemoryStore hides a MemoryStore's type, so that the handler bounds
// its calls as it does a network store's.
type nonMemoryStore struct{ *MemoryStore }
