package idemserver

import (
	"context"
	"errors"
	"sync"
	"time"
)

// renewal keeps a claim alive while its handler runs: every third of the
// lock timeout it calls [Store.Renew], so that a handler slower than the
// lock timeout is neither run a second time by a retry nor left unstored.
//
// It runs on a [time.AfterFunc] timer rather than a goroutine with a
// ticker: a handler faster than a third of the lock timeout, nearly every
// one, costs one timer and starts no goroutine. stop ends it on every path
// and waits for the timer's function if it fired, so no goroutine outlives
// the request and no Renew races the Complete or Release that follows.
//
// The zero value is idle; start arms it once.
type renewal struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	// live counts the timer while it is armed or its function runs: stop
	// waits for it, so the function's goroutine has finished too.
	live sync.WaitGroup

	h          *handler
	key, token string
	every      time.Duration
}

// start arms the renewal of the claim on key held by token. ctx carries
// the request's values, not its cancellation.
func (rn *renewal) start(ctx context.Context, h *handler, key, token string) {
	rn.h, rn.key, rn.token = h, key, token
	rn.every = max(h.lockTimeout/3, time.Millisecond)
	rn.mu.Lock() // the timer may fire, and Reset it, before the assignment
	defer rn.mu.Unlock()
	rn.live.Add(1)
	rn.timer = time.AfterFunc(rn.every, func() { rn.renew(ctx) })
}

// renew runs on the timer's goroutine, holding the count in live until it
// re-arms the timer (which keeps it) or ends.
func (rn *renewal) renew(ctx context.Context) {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		rn.live.Done()
		return
	}
	rn.mu.Unlock()

	// A renewal slower than its interval is no use: the next one is due.
	rctx, cancel := context.WithTimeout(ctx, rn.every)
	err := rn.h.store.Renew(rctx, rn.key, rn.token, rn.h.lockTimeout)
	cancel()
	if errors.Is(err, ErrClaimLost) {
		// Nothing to keep: the Complete after the handler will fail too,
		// and log that the response was not stored.
		rn.h.logger.ErrorContext(ctx, "idemserver: claim lost while the handler ran; a retry may run it again", "error", err)
		rn.live.Done()
		return
	}
	if err != nil {
		// The store may be back before the lock times out: keep trying.
		rn.h.logger.ErrorContext(ctx, "idemserver: renewing the claim failed", "error", err)
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped {
		rn.live.Done()
		return
	}
	rn.timer.Reset(rn.every)
}

// stop disarms the renewal and waits for a renewal in flight to end. It
// may be called more than once, and on a renewal never started.
func (rn *renewal) stop() {
	rn.mu.Lock()
	if !rn.stopped && rn.timer != nil && rn.timer.Stop() {
		rn.live.Done() // disarmed before it fired: its function never runs
	}
	rn.stopped = true
	rn.mu.Unlock()
	rn.live.Wait()
}
