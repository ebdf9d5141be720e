package idemserver

import (
	"context"
	"errors"
	"sync"
	"time"
)

// renewer keeps one wrapped handler's claims alive while their handlers
// run: a claim held for a third of the lock timeout is renewed
// ([Store.Renew]), so that a handler slower than the lock timeout is
// neither run a second time by a retry nor left unstored.
//
// One timer serves every request of the handler. A timer per request
// (time.AfterFunc, stopped when the handler returns) was measured to cost
// about 7% of a loopback round trip: arming a runtime timer earlier than
// any pending one wakes the network poller, a system call per request.
// The shared timer is armed when a claim is registered and none is armed,
// and fires when the oldest claim is due; finding no claim, it is not
// armed again. So it may fire once, doing nothing, up to LockTimeout/3
// after the last request: the one thing that outlives a request, and the
// reason this departs from "every timer is stopped on every path".
//
// Claims wait in a list ordered by when they were last renewed (or
// registered), oldest first, so a tick looks only at the claims due. Each
// due claim is renewed on its own goroutine, so a slow store delays no
// other claim; [renewal.stop] waits for that goroutine, so none outlives
// its request and no Renew races the Complete or Release that follows.
type renewer struct {
	h     *handler
	every time.Duration

	mu         sync.Mutex
	head, tail *renewal // registered claims, by since
	timer      *time.Timer
	armed      bool
}

// renewal is one request's claim in its handler's renewer. The zero value
// is idle; start registers it once.
type renewal struct {
	r          *renewer
	key, token string
	// ctx carries the request's values (not its cancellation) to the
	// Renew calls the renewer makes on the request's behalf, so that
	// traces and loggers see them; it lives no longer than the request.
	ctx context.Context

	// Guarded by r.mu:
	since      time.Time // registered or last renewed
	prev, next *renewal
	linked     bool
	running    bool           // a Renew goroutine has not yet finished
	inFlight   sync.WaitGroup // that goroutine, for stop
}

// start registers the claim on key held by token.
func (rn *renewal) start(ctx context.Context, h *handler, key, token string) {
	r := h.renewer
	rn.r, rn.key, rn.token, rn.ctx = r, key, token, ctx
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rn.since = now
	r.pushBack(rn)
	if !r.armed {
		r.armed = true
		if r.timer == nil {
			r.timer = time.AfterFunc(r.every, r.tick)
		} else {
			r.timer.Reset(r.every)
		}
	}
}

// stop unregisters the claim and waits for a renewal in flight. It may be
// called more than once, and on a renewal never started.
func (rn *renewal) stop() {
	r := rn.r
	if r == nil {
		return
	}
	r.mu.Lock()
	if rn.linked {
		r.remove(rn)
	}
	r.mu.Unlock()
	rn.inFlight.Wait()
}

// tick runs on the timer's goroutine: it starts the renewals due and arms
// the timer for the next one.
func (r *renewer) tick() {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for rn := r.head; rn != nil && now.Sub(rn.since) >= r.every; rn = r.head {
		r.remove(rn)
		rn.since = now
		r.pushBack(rn) // renewed now, so the newest
		if rn.running {
			continue // the last renewal is still waiting for the store
		}
		rn.running = true
		rn.inFlight.Add(1) // under mu, before stop can unlink and Wait
		go r.renew(rn)
	}
	if r.head == nil {
		r.armed = false
		return
	}
	r.timer.Reset(max(r.head.since.Add(r.every).Sub(now), time.Millisecond))
}

// renew renews one claim.
func (r *renewer) renew(rn *renewal) {
	defer rn.inFlight.Done()
	// A renewal slower than its interval is no use: the next one is due.
	ctx, cancel := context.WithTimeout(rn.ctx, r.every)
	err := r.h.store.Renew(ctx, rn.key, rn.token, r.h.lockTimeout)
	cancel()
	switch {
	case errors.Is(err, ErrClaimLost):
		// Nothing to keep: the Complete after the handler will fail too,
		// and log that the response was not stored.
		r.h.logger.ErrorContext(rn.ctx, "idemserver: claim lost while the handler ran; a retry may run it again", "error", err)
		r.h.hooks.renewFailed(rn.ctx, true, err)
	case err != nil:
		// The store may be back before the lock times out: try again at
		// the next interval.
		r.h.logger.ErrorContext(rn.ctx, "idemserver: renewing the claim failed", "error", err)
		r.h.hooks.renewFailed(rn.ctx, false, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rn.running = false
	if errors.Is(err, ErrClaimLost) && rn.linked {
		r.remove(rn) // no more renewals
	}
}

// pushBack appends rn to the list. The caller holds r.mu.
func (r *renewer) pushBack(rn *renewal) {
	rn.prev, rn.next, rn.linked = r.tail, nil, true
	if r.tail == nil {
		r.head = rn
	} else {
		r.tail.next = rn
	}
	r.tail = rn
}

// remove unlinks rn from the list. The caller holds r.mu.
func (r *renewer) remove(rn *renewal) {
	if rn.prev == nil {
		r.head = rn.next
	} else {
		rn.prev.next = rn.next
	}
	if rn.next == nil {
		r.tail = rn.prev
	} else {
		rn.next.prev = rn.prev
	}
	rn.prev, rn.next, rn.linked = nil, nil, false
}
