package idemserver

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// renewer keeps one wrapped handler's claims alive while their handlers
// run ([Store.Renew]), so that a handler slower than the lock timeout is
// neither run a second time by a retry nor left unstored, and so that a
// claim outlives a store outage that ends before its lock times out.
//
// # When
//
// A claim is renewed every tenth of the lock timeout while the store
// answers. A renewal that fails is tried again at once if it failed
// slowly (it took at least retry), or retry after it began if it failed
// fast, until the store answers; each attempt has its own timeout, a
// twentieth of the lock timeout, so a store that hangs costs a bounded
// wait, never a skipped renewal. The store's lock on a claim runs from when
// it handled the last renewal, so at least from when that renewal began
// (expires below), and a claim is lost only to an outage that lasts until
// then. With the numbers here, that is any outage shorter than 0.85 of the
// lock timeout whenever it starts (the worst case: it begins just before a
// renewal is due, and the attempt under way when it ends hangs until its
// timeout), and shorter than 0.95 of it when it begins just after a
// renewal. A renewal every third of the lock timeout, with no retry before
// the next interval, lost the claim to an outage of 0.45 of it: both tries
// fell inside, and the third came after the claim had expired.
//
// # How
//
// One timer serves every request of the handler. A timer per request
// (time.AfterFunc, stopped when the handler returns) was measured to cost
// about 7% of a loopback round trip: arming a runtime timer earlier than
// any pending one wakes the network poller, a system call per request.
// The shared timer is armed when a claim is registered and none is armed,
// and fires when the earliest claim is due; finding no claim, it is not
// armed again. So it may fire once, doing nothing, up to a tenth of the
// lock timeout after the last request: the one thing that outlives a
// request, and the reason this departs from "every timer is stopped on
// every path".
//
// Claims wait in a list ordered by when they are due, earliest first, so a
// tick looks only at the claims due. A claim is registered or renewed at
// the latest time, so it joins at the back; a retry, due sooner, walks
// back to its place from the tail. Each due claim is renewed on its own
// goroutine, so a slow store delays no other claim; [renewal.stop] waits
// for that goroutine, so none outlives its request and no Renew races the
// Complete or Release that follows.
type renewer struct {
	h       *handler
	every   time.Duration // between renewals while the store answers
	retry   time.Duration // from a failed attempt's start to the next
	timeout time.Duration // of one attempt
	// attempt bounds one Complete or Release after the handler, which
	// may carry a large record: a quarter of the lock timeout, so that a
	// call stuck on a dead connection leaves time for more.
	attempt time.Duration
	clock   clock

	// spawn, when set (by tests), runs each attempt's goroutine instead
	// of a go statement, so a test can wait for attempts to finish.
	spawn func(func())

	mu         sync.Mutex
	head, tail *renewal // waiting claims, by due
	timer      timer
	armed      time.Time // when the timer fires; zero when it is not armed
}

// newRenewer returns the renewer of claims locked for lockTimeout.
func newRenewer(h *handler, lockTimeout time.Duration) *renewer {
	return &renewer{
		h:       h,
		every:   max(lockTimeout/10, time.Millisecond),
		retry:   max(lockTimeout/100, time.Millisecond),
		timeout: max(lockTimeout/20, time.Millisecond),
		attempt: max(lockTimeout/4, time.Millisecond),
		clock:   realClock{},
	}
}

// clock is the renewer's time, a seam for tests.
type clock interface {
	now() time.Time
	afterFunc(d time.Duration, f func()) timer
}

type timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type realClock struct{}

func (realClock) now() time.Time { return time.Now() }

func (realClock) afterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

// steadyClock is a process clock read through a function (the
// simulator's, set through internal/serverclock), made steady: a reading
// earlier than the latest one carries on from the latest, so that a clock
// set back does not hold every renewal due after the latest reading until
// the clock has caught up again (the claim's lock, measured by the store,
// runs out meanwhile, and a retry runs the handler beside this one), nor
// make a Complete after the handler be tried for as long as the clock
// went back. A clock set forward looks like time passing: renewals come
// due at once, which costs a renewal each, and a Complete is tried again
// for a tenth of the lock timeout, then the claim pinned (fail closed).
//
// realClock needs none of this: time.Now's readings carry the runtime's
// monotonic clock, which no setting of the wall clock moves, and the
// renewer only compares them with each other. steadyClock is for a clock
// whose readings have no such part, as the simulator's jumps model.
//
// Timers are the runtime's: a timer measures a duration, which no setting
// of the clock moves.
type steadyClock struct {
	read   func() time.Time
	mu     sync.Mutex
	latest time.Time     // the latest reading returned
	ahead  time.Duration // added to read(): the set-backs seen so far
}

func newSteadyClock(read func() time.Time) *steadyClock { return &steadyClock{read: read} }

func (c *steadyClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.read().Add(c.ahead)
	if t.Before(c.latest) && !plant.ClockBack {
		c.ahead += c.latest.Sub(t)
		t = c.latest
	}
	c.latest = t
	return t
}

func (*steadyClock) afterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

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
	due        time.Time // when the next attempt starts
	expires    time.Time // the store holds the claim at least until then
	prev, next *renewal
	linked     bool           // waiting in the list
	stopped    bool           // stop was called: never linked again
	inFlight   sync.WaitGroup // an attempt's goroutine, for stop
}

// start registers the claim on key held by token, whose Claim was sent
// at claimed.
func (rn *renewal) start(ctx context.Context, h *handler, key, token string, claimed time.Time) {
	r := h.renewer
	rn.r, rn.key, rn.token, rn.ctx = r, key, token, ctx
	now := r.clock.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	rn.expires = claimed.Add(h.lockTimeout)
	rn.due = now.Add(r.every)
	r.insert(rn, now)
}

// stop unregisters the claim, waits for an attempt in flight, and returns
// the time until which the store holds the claim at least, as far as the
// renewals know. It may be called more than once, and on a renewal never
// started (then it returns the zero time).
func (rn *renewal) stop() time.Time {
	r := rn.r
	if r == nil {
		return time.Time{}
	}
	r.mu.Lock()
	rn.stopped = true
	if rn.linked {
		r.remove(rn)
	}
	r.mu.Unlock()
	rn.inFlight.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return rn.expires
}

// tick runs on the timer's goroutine: it starts the attempts due and arms
// the timer for the next one.
func (r *renewer) tick() {
	now := r.clock.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = time.Time{}
	for rn := r.head; rn != nil && !rn.due.After(now); rn = r.head {
		r.remove(rn)
		rn.inFlight.Add(1) // under mu, before stop can Wait
		// The attempt's timeout is set here, on the renewer's clock, so
		// that it counts from the moment the attempt is due.
		ctx, cancel := context.WithCancel(rn.ctx)
		t := r.clock.afterFunc(r.timeout, cancel)
		if r.spawn != nil {
			r.spawn(func() { r.renew(ctx, rn, cancel, t, now) })
		} else {
			go r.renew(ctx, rn, cancel, t, now)
		}
	}
	r.arm(now)
}

// renew makes one attempt, begun at began, and schedules the next.
func (r *renewer) renew(ctx context.Context, rn *renewal, cancel context.CancelFunc, t timer, began time.Time) {
	defer rn.inFlight.Done()
	err := r.h.store.Renew(ctx, rn.key, rn.token, r.h.lockTimeout)
	t.Stop()
	cancel()
	switch {
	case errors.Is(err, ErrClaimLost):
		// Nothing to keep: the Complete after the handler will fail too,
		// and log that the response was not stored.
		r.h.logger.ErrorContext(rn.ctx, "idemserver: claim lost while the handler ran; a retry may run it again", "error", err)
		r.h.hooks.renewFailed(rn.ctx, true, err)
	case err != nil:
		// The store may be back before the lock times out: try again soon.
		r.h.logger.ErrorContext(rn.ctx, "idemserver: renewing the claim failed; trying again", "error", err)
		r.h.hooks.renewFailed(rn.ctx, false, err)
	}
	now := r.clock.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		// The store measured the lock from when it renewed, no earlier
		// than the attempt began.
		rn.expires = began.Add(r.h.lockTimeout)
		rn.due = began.Add(r.every)
	case errors.Is(err, ErrClaimLost):
		return // no more renewals
	default:
		// At once after a slow failure; after retry since the attempt
		// began after a fast one, so that a store refusing at once is
		// not asked in a loop.
		rn.due = began.Add(r.retry)
	}
	if rn.stopped {
		return
	}
	if rn.due.Before(now) {
		rn.due = now
	}
	r.insert(rn, now)
}

// insert links rn at its place in the list by due, and arms the timer if
// rn is due before it fires. The caller holds r.mu.
func (r *renewer) insert(rn *renewal, now time.Time) {
	at := r.tail
	for at != nil && at.due.After(rn.due) {
		at = at.prev
	}
	rn.prev, rn.linked = at, true
	if at == nil {
		rn.next = r.head
		r.head = rn
	} else {
		rn.next = at.next
		at.next = rn
	}
	if rn.next == nil {
		r.tail = rn
	} else {
		rn.next.prev = rn
	}
	if r.head == rn {
		r.arm(now)
	}
}

// arm sets the timer for the list's head, unless it already fires in
// time. The caller holds r.mu.
func (r *renewer) arm(now time.Time) {
	if r.head == nil {
		return // an armed timer fires once and finds nothing
	}
	due := r.head.due
	if !r.armed.IsZero() && !r.armed.After(due) {
		return
	}
	r.armed = due
	d := max(due.Sub(now), time.Millisecond)
	if r.timer == nil {
		r.timer = r.clock.afterFunc(d, r.tick)
	} else {
		r.timer.Reset(d)
	}
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
