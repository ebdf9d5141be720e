package idemhttp

import (
	"context"
	"sync"

	"github.com/idemkit/idemhttp/internal/plant"
)

// This file is the senders' slots: one sender per operation (and per key)
// at a time, per journal, within a process (docs/lifecycle.md, "One sender
// at a time"). The lifecycle (lifecycle.go) takes them in open and frees
// them in settle, answer or unwind.

// senders makes one operation have one sender at a time within a
// process, per journal: a call (or a resend) holds its operation id's and
// its key's slots from before it reads the journal until its outcome is
// written, so that no other call of the operation sends under the key
// meanwhile, nor withdraws or finishes the entry it sends under. The
// table is the process's (slots), not a Client's: two Clients sharing a
// journal share its slots, since the entries they protect are the same.
// A slot's scope is the journal value, reached through the caller's
// wrappers (journal_identity.go), or a Client of its own for the
// in-memory journal and for calls without a journal (see config.scope).
// A second call waits for the first rather than being answered locally:
// once the first is done, the second sees its outcome (a done operation's
// result, or a pending entry it may now send, or a withdrawn one it
// begins anew), which is what the caller asked for; answering it at once
// could only say "busy".
type senders struct {
	mu   sync.Mutex
	busy map[slotID]*slot
}

// slots is the process's table of senders' slots.
var slots senders

// slotID names a slot: an operation id (kind 'o') or a key (kind 'k')
// within a scope.
type slotID struct {
	scope any
	kind  byte
	id    string
}

// slot is a held slot and the goroutines waiting for it, in the order
// they came (most slots are never waited for). A release hands the slot
// to the first of them: a waiter that came later never goes first, so
// that which call sends first, and whether it waited, depends only on
// when each asked (the simulator's same seed, same trace: two calls woken
// at once by one release took it in the scheduler's order).
type slot struct {
	queue []*slotWaiter
}

// slotWaiter is one goroutine waiting for a slot: ch is closed when the
// slot is handed to it (granted, set under the table's lock first).
type slotWaiter struct {
	ch      chan struct{}
	granted bool
}

// acquire takes id's slot, waiting for its holder to release it, until ctx
// ends. It reports whether it waited.
func (s *senders) acquire(ctx context.Context, id slotID) (waited bool, err error) {
	s.mu.Lock()
	if s.busy == nil {
		s.busy = make(map[slotID]*slot)
	}
	sl, ok := s.busy[id]
	if !ok {
		s.busy[id] = &slot{}
		s.mu.Unlock()
		return false, nil
	}
	w := &slotWaiter{ch: make(chan struct{})}
	sl.queue = append(sl.queue, w)
	s.mu.Unlock()
	select {
	case <-w.ch:
		return true, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.granted {
		// Handed over as ctx ended: pass it on, as its holder would.
		s.mu.Unlock()
		s.release(id)
		return true, ctx.Err()
	}
	for i, q := range sl.queue {
		if q == w {
			sl.queue = append(sl.queue[:i], sl.queue[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	return true, ctx.Err()
}

// waiters returns how many goroutines wait for a slot of scope (a
// journal, through its wrappers, or a scope).
func (s *senders) waiters(scope any) int {
	scope = scopeOf(scope)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for id, sl := range s.busy {
		if id.scope == scope {
			n += len(sl.queue)
		}
	}
	return n
}

// held returns how many slots of scope (as for waiters) are held, for
// tests.
func (s *senders) held(scope any) int {
	scope = scopeOf(scope)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for id := range s.busy {
		if id.scope == scope {
			n++
		}
	}
	return n
}

// release frees id's slot: hands it to its first waiter, if any.
func (s *senders) release(id slotID) {
	s.mu.Lock()
	sl := s.busy[id]
	if sl == nil || len(sl.queue) == 0 {
		delete(s.busy, id)
		s.mu.Unlock()
		return
	}
	w := sl.queue[0]
	sl.queue[0] = nil
	sl.queue = sl.queue[1:]
	w.granted = true
	s.mu.Unlock()
	close(w.ch)
}

// hold takes the slot of id, an operation id (kind 'o') or a key ('k'),
// for a, remembering it for releaseAll. Slots are taken in one order, an
// operation id's before a key's, and a call holds at most one of each,
// so two calls never wait for each other.
func (a *operation) hold(ctx context.Context, kind byte, id string) (waited bool, err error) {
	if plant.NoSenderSlots { // a planted bug (internal/plant), false but in a test build
		return false, nil
	}
	sid := slotID{a.scope, kind, id}
	for _, h := range a.held {
		if h == sid {
			return false, nil
		}
	}
	waited, err = slots.acquire(ctx, sid)
	if err == nil {
		if a.held == nil {
			a.held = make([]slotID, 0, 2) // an operation id's and a key's
		}
		a.held = append(a.held, sid)
	}
	return waited, err
}

func (a *operation) releaseAll() {
	for _, id := range a.held {
		slots.release(id)
	}
	a.held = a.held[:0]
}

// releaseKey frees the slot of a key the call no longer uses.
func (a *operation) releaseKey(key string) {
	id := slotID{a.scope, 'k', key}
	for i, h := range a.held {
		if h == id {
			slots.release(id)
			a.held = append(a.held[:i], a.held[i+1:]...)
			return
		}
	}
}
