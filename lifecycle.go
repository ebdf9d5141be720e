package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/plant"
	"github.com/idemkit/idemhttp/internal/simkey"
)

// This file is an operation's lifecycle: the one home of every decision
// about its journal entry, whichever way the call came in (Do, the
// StandardClient's transport, Resume). docs/lifecycle.md draws it:
//
//	minted -> journaled -> attempting -> not-sent | maybe-sent
//	       -> done | pending | withdrawn | abandoned
//
// advance moves a call along it and refuses a move the table does not
// allow; settle is the only place that writes the entry's outcome.

// phase is where an operation stands in one call.
type phase uint8

const (
	phaseMinted     phase = iota // the key is chosen; nothing is written
	phaseJournaled               // the pending entry is durable, or was found (a rerun's, a resend's)
	phaseAttempting              // an attempt is on its way
	phaseNotSent                 // every attempt so far provably left nothing the server could act on
	phaseMaybeSent               // an attempt may have reached the server, or got an answer
	phaseDone                    // a definite outcome: the entry is done
	phasePending                 // ended without one: the entry stays pending, for Resume
	phaseWithdrawn               // ended having sent nothing: the entry the call created is gone
	phaseAbandoned               // past the retention, or a withdrawal that failed: a person decides
	phaseAnswered                // answered locally: a done operation's result or refusal; nothing sent, nothing written
)

var phaseNames = [...]string{"minted", "journaled", "attempting", "not-sent", "maybe-sent", "done", "pending", "withdrawn", "abandoned", "answered"}

func (p phase) String() string { return phaseNames[p] }

// next lists the moves the lifecycle allows. Two matter most, by their
// absence: nothing leaves maybe-sent for withdrawn (an operation that may
// have run is never forgotten), and nothing leaves a final phase.
var next = [phaseAnswered + 1][]phase{ // every phase, the final ones with no move
	phaseMinted:     {phaseJournaled, phaseAttempting, phaseAnswered},
	phaseJournaled:  {phaseAttempting, phaseNotSent, phaseAbandoned},
	phaseAttempting: {phaseNotSent, phaseMaybeSent},
	phaseNotSent:    {phaseAttempting, phaseWithdrawn, phasePending},
	phaseMaybeSent:  {phaseAttempting, phaseDone, phasePending},
}

// lifecycleBug, set by the package's tests, hears of every move the
// lifecycle refused, in every test: each is a bug in the client.
var lifecycleBug func(from, to phase)

// advance moves a to to, if the lifecycle allows it. A move it does not
// allow is a bug in the client: it is recorded (tests fail on it) and
// refused, so that the call keeps its safer phase.
func (a *operation) advance(to phase) bool {
	for _, p := range next[a.phase] {
		if p == to {
			if f := a.cfg.onPhase; f != nil {
				f(a.phase, to)
			}
			a.phase = to
			return true
		}
	}
	a.badMoves = append(a.badMoves, [2]phase{a.phase, to})
	if lifecycleBug != nil {
		lifecycleBug(a.phase, to)
	}
	return false
}

// senders makes one operation have one sender at a time within a
// process: a call (or a resend) holds its operation id's and its key's
// slots from before it reads the journal until its outcome is written, so
// that no other call of the operation sends under the key meanwhile, nor
// withdraws or finishes the entry it sends under. A second call waits for
// the first rather than being answered locally: once the first is done,
// the second sees its outcome (a done operation's result, or a pending
// entry it may now send, or a withdrawn one it begins anew), which is what
// the caller asked for; answering it at once could only say "busy".
type senders struct {
	mu      sync.Mutex
	busy    map[string]chan struct{}
	waiting int // goroutines waiting for a slot, for tests
}

// acquire takes id's slot, waiting for its holder to release it, until ctx
// ends. It reports whether it waited.
func (s *senders) acquire(ctx context.Context, id string) (waited bool, err error) {
	for {
		s.mu.Lock()
		if s.busy == nil {
			s.busy = make(map[string]chan struct{})
		}
		ch, ok := s.busy[id]
		if !ok {
			s.busy[id] = make(chan struct{})
			s.mu.Unlock()
			return waited, nil
		}
		s.waiting++
		s.mu.Unlock()
		waited = true
		select {
		case <-ch:
		case <-ctx.Done():
		}
		s.mu.Lock()
		s.waiting--
		s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return waited, err
		}
	}
}

// waiters returns how many goroutines wait for a slot.
func (s *senders) waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// release frees id's slot.
func (s *senders) release(id string) {
	s.mu.Lock()
	ch := s.busy[id]
	delete(s.busy, id)
	s.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// hold takes id's slot for a, remembering it for releaseAll. Slots are
// taken in one order, an operation id's before a key's, and a call holds
// at most one of each, so two calls never wait for each other.
func (a *operation) hold(ctx context.Context, id string) (waited bool, err error) {
	if plant.NoSenderSlots { // a planted bug (internal/plant), false but in a test build
		return false, nil
	}
	for _, h := range a.held {
		if h == id {
			return false, nil
		}
	}
	waited, err = a.cfg.senders.acquire(ctx, id)
	if err == nil {
		a.held = append(a.held, id)
	}
	return waited, err
}

func (a *operation) releaseAll() {
	for _, id := range a.held {
		a.cfg.senders.release(id)
	}
	a.held = a.held[:0]
}

// open chooses the key and the journal entry of a keyed call, as its one
// sender in this process. For a resend (Resume, rs) it rereads the entry
// instead of beginning one: an entry withdrawn or finished meanwhile is
// not sent again. ok is false when the call is answered without sending,
// and resp and err say how. want is the caller's key, "" if none.
func (a *operation) open(ctx context.Context, req *http.Request, want string, explicit bool, body []byte, rs *resend) (resp *http.Response, err error, ok bool) {
	for {
		if a.operation != "" {
			if _, err := a.hold(ctx, "o\x00"+a.operation); err != nil {
				r, e := a.answer(nil, err)
				return r, e, false
			}
		}
		key, minted := want, false
		switch {
		case rs != nil:
			key = rs.entry.Key
		case key == "":
			key, minted = mintKey(ctx), true
		}
		if !minted || a.j != nil {
			// A caller's key, the journal's, or a minted key that Resume
			// could list from the journal: nobody else may send under it
			// meanwhile. A minted key without a journal nobody else knows.
			if _, err := a.hold(ctx, "k\x00"+key); err != nil {
				r, e := a.answer(nil, err)
				return r, e, false
			}
		}
		a.key = key
		if a.j == nil {
			a.fresh = minted
			a.advance(phaseAttempting)
			return nil, nil, true
		}

		var e *Entry
		if rs != nil {
			e, err = a.reread(ctx, rs.entry)
		} else {
			e, err = a.begin(ctx, req, key, explicit, body)
		}
		if err != nil {
			resp, err := a.answer(nil, err)
			return resp, err, false
		}
		if e.Key != key {
			// The operation's entry has another key than the one tried:
			// hold that one instead. Having to wait for it means another
			// call was sending under it: begin again, to see what it left.
			a.releaseKey(key)
			waited, err := a.hold(ctx, "k\x00"+e.Key)
			if err != nil {
				r, e := a.answer(nil, err)
				return r, e, false
			}
			if waited {
				a.releaseAll()
				continue
			}
			a.key = e.Key
		}
		a.entry, a.fresh = e, minted && a.created
		if !a.created {
			if resp, err, answered := a.judge(ctx, req, e, rs); answered {
				return resp, err, false
			}
		}
		a.advance(phaseJournaled)
		return nil, nil, true
	}
}

// mintKey is NewKey, unless the simulator names the keys its calls mint
// (internal/simkey: a world's keys must be the same on every run).
func mintKey(ctx context.Context) string {
	if k := simkey.Mint(ctx); k != "" {
		return k
	}
	return NewKey()
}

// releaseKey frees the slot of a key the call no longer uses.
func (a *operation) releaseKey(key string) {
	id := "k\x00" + key
	for i, h := range a.held {
		if h == id {
			a.cfg.senders.release(id)
			a.held = append(a.held[:i], a.held[i+1:]...)
			return
		}
	}
}

// begin records the pending entry for a keyed call before anything is
// sent, or finds the entry a previous call or run left for the same
// operation (created is then false).
//
// An operation's journaled key wins over a key in the request's header:
// the caller declared the operation's identity with WithOperation, and an
// SDK that mints a key per call (stripe-go does) would otherwise make a
// rerun of the operation a new one. A key given with WithKey that differs
// from the journal's is a conflict.
func (a *operation) begin(ctx context.Context, req *http.Request, key string, explicit bool, body []byte) (*Entry, error) {
	c, p, j := a.c, a.p, a.j
	url, err := contract.JournalURLOf(req.URL, p.redactQuery)
	if err != nil {
		return nil, err
	}
	fp := contract.Fingerprint(req.Method, url, body)
	h := req.Header.Clone()
	contract.DropSecrets(h, p.keyHeader, c.cfg.secrets)
	now := c.stamp(j)
	e := &Entry{
		Operation:   a.operation,
		Key:         key,
		Method:      req.Method,
		URL:         url,
		Header:      h,
		Body:        body,
		Fingerprint: fp,
		Created:     now,
		Updated:     now,
		State:       StatePending,
	}
	t0 := c.journalClock()
	existing, err := j.Begin(ctx, e)
	ev := idemtrace.JournalEvent{Op: idemtrace.JournalBegin, Operation: a.operation, Key: key, State: string(StatePending), Err: err}
	if existing != nil {
		ev.Key, ev.State, ev.Existing = existing.Key, string(existing.State), true
	}
	c.journalEvent(ctx, ev, t0)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal: %w", err) // not ErrNotSent: a failed Begin may yet be on disk
	}
	if existing == nil {
		a.created = true
		return e, nil
	}
	if explicit && existing.Key != key {
		return nil, fmt.Errorf("idemhttp: %w: operation %q has key %s in the journal, request has %s", ErrKeyConflict, a.operation, existing.Key, key)
	}
	if existing.Fingerprint != fp {
		return nil, &KeyMismatchError{Key: existing.Key, Operation: existing.Operation}
	}
	return existing, nil
}

// reread returns e as the journal holds it now, for a resend: nil and an
// error when it is gone or no longer pending.
func (a *operation) reread(ctx context.Context, e *Entry) (*Entry, error) {
	cur, err := a.j.Get(ctx, e.Key)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("idemhttp: resume %s: %w: the entry is gone (withdrawn, deleted or pruned since it was listed)", e.Key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("idemhttp: resume %s: %w", e.Key, err)
	}
	if cur.Body == nil && contract.Fingerprint(cur.Method, cur.URL, nil) != cur.Fingerprint {
		return nil, fmt.Errorf("idemhttp: resume %s: %w: the journal does not store bodies", e.Key, ErrNotReplayable)
	}
	return cur, nil
}

// judge decides whether an existing entry may be sent again under its
// key, for a rerun of its operation (Do) and for a resend (Resume): the
// one home of those rules. answered is true when it may not, with what
// the call returns. rs is Resume's resend, nil for Do: its mark is the
// journal's high-water mark, read once for all its entries.
func (a *operation) judge(ctx context.Context, req *http.Request, e *Entry, rs *resend) (resp *http.Response, err error, answered bool) {
	resending, mark := rs != nil, time.Time{}
	if resending {
		mark = rs.mark
	}
	c, p, j := a.c, a.p, a.j
	now, err := c.journalNow(ctx, j)
	if err != nil {
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: journal: %w", err))
		return resp, err, true
	}
	switch e.State {
	case StateDone:
		if r := e.Result; r != nil && !resending {
			resp, err := a.answer(a.replayResult(req, r), nil)
			return resp, err, true
		}
		if !p.refetchDone || now.Sub(e.Created) > p.retention || resending {
			resp, err := a.answer(nil, &DoneError{Operation: e.Operation, Key: e.Key, Status: e.LastStatus, Attempts: e.Attempts, Finished: e.Updated, Result: e.Result})
			return resp, err, true
		}
		// Within the server's retention it still holds the key: a resend
		// under it gets the stored response, and runs nothing.
		return nil, nil, false
	case StateAbandoned:
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrKeyExpired))
		return resp, err, true
	}
	if mark.IsZero() {
		if mark, err = journalHighWater(ctx, j); err != nil {
			resp, err := a.answer(nil, fmt.Errorf("idemhttp: journal: %w", err))
			return resp, err, true
		}
	}
	if t := contract.Latest(e.Created, e.Updated, mark); t.After(now.Add(ClockTolerance)) {
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w: the journal holds times up to %s, the clock says %s",
			e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrClockJump, t.Format(time.RFC3339), now.Format(time.RFC3339)))
		return resp, err, true
	}
	if now.Sub(e.Created) > p.retention {
		// The server may have forgotten the key: a resend could run the
		// operation twice. Nobody resends it from now on.
		a.advance(phaseJournaled)
		a.advance(phaseAbandoned)
		a.writeAbandoned(ctx, e)
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrKeyExpired))
		return resp, err, true
	}
	return nil, nil, false
}

// answer ends a call that sends nothing: slots released, nothing written
// (but the abandonment judge may have written). Like every call refused
// before its preparation, it reports no hooks.
func (a *operation) answer(resp *http.Response, err error) (*http.Response, error) {
	if a.phase != phaseAbandoned {
		a.advance(phaseAnswered)
	}
	a.releaseAll()
	a.settled = true
	return resp, err
}

// notSent marks err as a failure before anything reached the wire.
func (a *operation) notSent(err error) error {
	if errors.Is(err, ErrNotSent) {
		return err
	}
	var g *GiveUpError
	if errors.As(err, &g) {
		g.NotSent = true
		return err
	}
	return &notSentError{err: err}
}

// notSentError wraps an error of a call that sent nothing, so that
// errors.Is(err, ErrNotSent) holds and the cause is still reachable.
type notSentError struct{ err error }

func (e *notSentError) Error() string   { return e.err.Error() }
func (e *notSentError) Unwrap() []error { return []error{e.err, ErrNotSent} }

// sawAttempt folds one attempt's wire evidence into the call's phase:
// once an attempt may have reached the server, the call stays maybe-sent,
// whatever later attempts show.
func (a *operation) sawAttempt(reached bool) {
	if a.phase != phaseAttempting {
		a.advance(phaseAttempting)
	}
	a.reached = a.reached || reached
	if a.reached {
		a.advance(phaseMaybeSent)
	} else {
		a.advance(phaseNotSent)
	}
}

// settle ends a call that opened (or that got past its key): it decides
// the operation's outcome from what the call saw, writes it to the
// journal (the one place that does), frees the slots and reports the
// call's end. Every path out of a call after open goes through it once.
func (a *operation) settle(ctx context.Context, resp *http.Response, err error) (*http.Response, error) {
	if a.settled {
		return resp, err
	}
	a.settled = true
	defer a.releaseAll()
	if a.phase == phaseJournaled || a.phase == phaseAttempting {
		a.advance(phaseNotSent) // it ended before any attempt could leave
	}
	to := a.outcome(resp, err)
	a.advance(to)
	gone := true // nothing of the call is left in a journal
	if a.entry != nil {
		switch to {
		case phaseDone:
			var r *Result
			if resp != nil && a.p.keepResults > 0 {
				r = keepResult(resp, a.p.keepResults)
			}
			a.writeFinish(ctx, StateDone, r)
		case phasePending:
			a.writeFinish(ctx, StatePending, nil)
		case phaseWithdrawn:
			gone = a.withdraw(ctx)
		}
	}
	if err != nil && !a.reached && gone && (!a.keyed || a.fresh) {
		// Nothing left, on the wire nor in the journal, under a key minted
		// for this call (no other call can have used it) or none: trying
		// again under a new key is safe. A caller's key, or a journal's,
		// may have been used by an earlier call; an entry the journal
		// failed to withdraw may yet be resent: then the call cannot say
		// so.
		err = a.notSent(err)
	}
	return a.end(resp, err)
}

// outcome decides where a call that ran ends: the wire evidence first (a
// call whose every attempt provably sent nothing withdraws the entry it
// created), then the answer.
func (a *operation) outcome(resp *http.Response, err error) phase {
	if !a.reached {
		if a.created || a.entry == nil {
			return phaseWithdrawn
		}
		return phasePending // an earlier call or run may have sent it
	}
	switch {
	case err == nil && (a.redirectRefused && !plant.RedirectDone || a.passedThrough):
		// A 3xx not followed ran nothing at its target; a give-up handed
		// to an SDK as its last response is still a give-up. (The
		// planted bugs of internal/plant are false but in a test build.)
		return phasePending
	case err == nil, errors.Is(err, ErrKeyMismatch), errors.Is(err, ErrKeyRequired):
		return phaseDone
	case plant.GiveUpDone && errors.Is(err, ErrExhausted):
		return phaseDone
	}
	return phasePending
}

// writeFinish records the call's outcome. A failure cannot change the
// call's result (the request already went out), and leaves the entry
// pending, which Resume resolves by resending with the same key; so it is
// logged, not returned. ErrFenced means another sender finished or holds
// the entry: its outcome is the one that counts.
func (a *operation) writeFinish(ctx context.Context, s State, r *Result) {
	c, e := a.c, a.entry
	t0 := c.journalClock()
	err := a.j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: s, Status: a.lastStatus, Attempts: a.attempts, At: c.stamp(a.j), Result: r})
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalFinish, Key: e.Key, Operation: e.Operation, State: string(s), Err: err}, t0)
	if err != nil && c.cfg.logger != nil {
		level, msg := slog.LevelWarn, "idemhttp: journal finish failed; entry stays pending"
		if errors.Is(err, ErrFenced) {
			level, msg = slog.LevelInfo, "idemhttp: journal entry finished or held by another sender; left to it"
		}
		c.cfg.logger.LogAttrs(ctx, level, msg, slog.String("key", e.Key), slog.String("state", string(s)), slog.String("error", err.Error()))
	}
}

// withdraw removes the entry of a call that created it and provably sent
// nothing, so that Resume never sends a request its caller was told did
// not go out. Should the removal fail, the entry is marked abandoned
// instead: Resume never sends either. An entry another sender finished or
// holds (ErrFenced) is left to it. It reports whether nothing of the call
// is left that Resume would send: false when both writes failed, and the
// entry stays pending.
func (a *operation) withdraw(ctx context.Context) bool {
	c, e := a.c, a.entry
	ctx = context.WithoutCancel(ctx)
	t0 := c.journalClock()
	err := a.j.Delete(ctx, e.Key)
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrFenced) {
		c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: e.Key, Operation: e.Operation}, t0)
		return true
	}
	err2 := a.j.Finish(ctx, e.Key, Outcome{State: StateAbandoned, At: c.stamp(a.j)})
	if errors.Is(err2, ErrFenced) {
		err2 = nil
	}
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: e.Key, Operation: e.Operation, State: string(StateAbandoned), Err: errors.Join(err, err2)}, t0)
	if c.cfg.logger != nil {
		msg := "idemhttp: journal: could not withdraw an entry that was never sent; marked abandoned"
		if err2 != nil {
			msg = "idemhttp: journal: could not withdraw an entry that was never sent, nor mark it abandoned; it stays pending"
		}
		c.cfg.logger.LogAttrs(ctx, slog.LevelError, msg, slog.String("key", e.Key), slog.String("error", errors.Join(err, err2).Error()))
	}
	return err2 == nil
}

// writeAbandoned marks an entry past the retention abandoned.
func (a *operation) writeAbandoned(ctx context.Context, e *Entry) {
	c := a.c
	err := a.j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: StateAbandoned, Status: e.LastStatus, At: c.stamp(a.j)})
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalFinish, Key: e.Key, Operation: e.Operation, State: string(StateAbandoned), Err: err}, time.Time{})
	if err != nil && !errors.Is(err, ErrFenced) && c.cfg.logger != nil {
		c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemhttp: journal: could not mark an expired entry abandoned", slog.String("key", e.Key), slog.String("error", err.Error()))
	}
}
