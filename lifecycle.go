package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// open chooses the key and the journal entry of a keyed call, as its one
// sender in this process. For a resend (Resume, rs) it rereads the entry
// instead of beginning one: an entry withdrawn or finished meanwhile is
// not sent again. ok is false when the call is answered without sending,
// and resp and err say how. want is the caller's key, "" if none.
func (a *operation) open(ctx context.Context, req *http.Request, want string, explicit bool, body []byte, rs *resend) (resp *http.Response, err error, ok bool) {
	for {
		if a.operation != "" {
			if _, err := a.hold(ctx, 'o', a.operation); err != nil {
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
			if _, err := a.hold(ctx, 'k', key); err != nil {
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
		again, resp, err, ok := a.openEntry(ctx, req, key, minted, explicit, body, rs)
		if !again {
			return resp, err, ok
		}
	}
}

// openEntry is open's part for a call with a journal: it begins (or, for
// a resend, rereads) the journal entry of key. again asks open to begin
// again: the entry had another key, which another call was sending under.
//
//go:noinline
func (a *operation) openEntry(ctx context.Context, req *http.Request, key string, minted, explicit bool, body []byte, rs *resend) (again bool, resp *http.Response, err error, ok bool) {
	var e *Entry
	if rs != nil {
		e, err = a.reread(ctx, rs.entry)
	} else {
		e, err = a.begin(ctx, req, key, explicit, body)
	}
	if err != nil {
		resp, err := a.answer(nil, err)
		return false, resp, err, false
	}
	if e.Key != key {
		// The operation's entry has another key than the one tried:
		// hold that one instead. Having to wait for it means another
		// call was sending under it: begin again, to see what it left.
		a.releaseKey(key)
		waited, err := a.hold(ctx, 'k', e.Key)
		if err != nil {
			r, e := a.answer(nil, err)
			return false, r, e, false
		}
		if waited {
			a.releaseAll()
			return true, nil, nil, false
		}
		a.key = e.Key
	}
	a.entry, a.fresh = e, minted && a.created && a.oneProcess()
	if !a.created {
		if resp, err, answered := a.judge(ctx, req, e, rs); answered {
			return false, resp, err, false
		}
	}
	a.advance(phaseJournaled)
	return false, nil, nil, true
}

// mintKey is NewKey, unless the simulator names the keys its calls mint
// (internal/simkey: a world's keys must be the same on every run).
func mintKey(ctx context.Context) string {
	if k := simkey.Mint(ctx); k != "" {
		return k
	}
	return NewKey()
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
	if err == nil && existing == nil {
		// The entry is this call's before the hook hears of it: should
		// the hook panic, unwind withdraws it.
		a.entry, a.created = e, true
	}
	c.journalEvent(ctx, ev, t0)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal: %w", err) // not ErrNotSent: a failed Begin may yet be on disk
	}
	if existing == nil {
		return e, nil
	}
	if explicit && existing.Key != key {
		return nil, fmt.Errorf("idemhttp: %w: operation %q has key %s in the journal, request has %s", ErrKeyConflict, a.operation, existing.Key, key)
	}
	if storedFingerprint(existing) != fp {
		return nil, localMismatch(existing, req.Method, url, body, p.redactQuery, p.redactPath)
	}
	return existing, nil
}

// storedFingerprint returns e's Fingerprint or, for an entry stored
// without one (begun directly through the previous release, which kept
// what its producer gave), the fingerprint of the request it holds. An
// entry that holds neither gives "", which matches no request.
func storedFingerprint(e *Entry) string {
	if e.Fingerprint != "" || e.Method == "" || e.Body == nil {
		return e.Fingerprint
	}
	return contract.Fingerprint(e.Method, e.URL, e.Body)
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
// the call returns. rs is Resume's resend, nil for Do.
//
// Whatever the entry's state, a send under its key is judged by one rule
// of age (age): a done entry refetched (Policy.RefetchDone) as much as a
// pending one resent, since both reach the server under the key.
func (a *operation) judge(ctx context.Context, req *http.Request, e *Entry, rs *resend) (resp *http.Response, err error, answered bool) {
	switch e.State {
	case StateAbandoned:
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrKeyExpired))
		return resp, err, true
	case StateDone:
		if r := e.Result; r != nil && rs == nil {
			resp, err := a.answer(a.replayResult(req, r), nil)
			return resp, err, true
		}
		done := &DoneError{Operation: e.Operation, Key: e.Key, Status: e.LastStatus, Attempts: e.Attempts, Finished: e.Updated, Result: e.Result}
		if rs != nil || !a.p.refetchDone {
			resp, err := a.answer(nil, done)
			return resp, err, true
		}
		// Within the server's retention it still holds the key: a resend
		// under it gets the stored response, and runs nothing. Past it, or
		// when its age is in doubt, done is done.
		switch _, expired, err := a.age(ctx, e, rs); {
		case err != nil && !errors.Is(err, ErrClockJump):
			resp, err := a.answer(nil, err) // the journal failed: say so
			return resp, err, true
		case err != nil || expired:
			resp, err := a.answer(nil, done)
			return resp, err, true
		}
		return nil, nil, false
	}
	now, expired, err := a.age(ctx, e, rs)
	if err != nil {
		resp, err := a.answer(nil, err)
		return resp, err, true
	}
	if expired {
		// The server may have forgotten the key: a resend could run the
		// operation twice. Nobody resends it from now on.
		a.advance(phaseJournaled)
		a.advance(phaseAbandoned)
		a.writeAbandoned(ctx, e)
		resp, err := a.answer(nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrKeyExpired))
		return resp, err, true
	}
	if a.parked(e, now) {
		resp, err := a.answer(nil, &ParkedError{Operation: e.Operation, Key: e.Key, NotBefore: e.NotBefore, Expires: e.Created.Add(a.p.retention)})
		return resp, err, true
	}
	return nil, nil, false
}

// clockDoubter is implemented by a [Journal] that knows of its clock
// having been set back by an amount nobody measured
// ([github.com/idemkit/idemhttp/filejournal.Journal.ClockDoubt]): an
// entry created at or before ClockDoubt's time is of unknown age, for
// good.
type clockDoubter interface {
	ClockDoubt(ctx context.Context) (time.Time, error)
}

// journalClockDoubt returns j's ClockDoubt if it has one, else the zero
// Time.
func journalClockDoubt(ctx context.Context, j *journalIdentity) (time.Time, error) {
	cd, ok := journalAs[clockDoubter](j)
	if !ok {
		return time.Time{}, nil
	}
	t, err := cd.ClockDoubt(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("clock doubt: %w", err)
	}
	return t, nil
}

// age judges whether a send under e's key may still reach a server that
// holds the key, by the journal's clock: an error wrapping ErrClockJump
// when e's times, or the journal's high-water mark, are ahead of the
// clock (it was set back, and no entry's age is known), or when e
// predates a set-back the journal could not measure, or the journal's
// error; expired when e is older than the retention. now is the
// journal's clock it judged by. rs is Resume's resend, whose mark it read
// once for all its entries.
func (a *operation) age(ctx context.Context, e *Entry, rs *resend) (now time.Time, expired bool, err error) {
	now, err = a.c.journalNow(ctx, a.j)
	if err != nil {
		return now, false, fmt.Errorf("idemhttp: journal: %w", err)
	}
	var mark time.Time
	if rs != nil {
		mark = rs.mark
	}
	if mark.IsZero() {
		if mark, err = journalHighWater(ctx, a.cfg.identity(a.j)); err != nil {
			return now, false, fmt.Errorf("idemhttp: journal: %w", err)
		}
	}
	if t := contract.Latest(e.Created, e.Updated, mark); t.After(now.Add(ClockTolerance)) {
		return now, false, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w: the journal holds times up to %s, the clock says %s",
			e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrClockJump, t.Format(time.RFC3339), now.Format(time.RFC3339))
	}
	// An entry from before a set-back the journal found and could not
	// measure (clockDoubter) is of unknown age for good, whatever the
	// clock says since.
	doubt, err := journalClockDoubt(ctx, a.cfg.identity(a.j))
	if err != nil {
		return now, false, fmt.Errorf("idemhttp: journal: %w", err)
	}
	if !doubt.IsZero() && !e.Created.After(doubt) {
		return now, false, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w: the clock was set back by an unknown amount when the journal held times up to %s",
			e.Operation, e.Key, e.Created.Format(time.RFC3339), ErrClockJump, doubt.Format(time.RFC3339))
	}
	return now, now.Sub(e.Created) > a.p.retention, nil
}

// parked reports whether e waits for its NotBefore (the server's
// Retry-After, which settle wrote when a call parked it) at now, by the
// journal's clock: judge then sends nothing and writes nothing. It comes
// after the retention rule, so an entry parked past the retention is
// abandoned once it outlives it, never sent.
func (a *operation) parked(e *Entry, now time.Time) bool {
	return !e.NotBefore.IsZero() && now.Before(e.NotBefore)
}

// parkUntil returns the time until which a call that ends pending parks
// its entry: when it stopped because the server asked it to come back
// later than it would wait (ErrRetryAfterTooLong), the journal's clock
// plus the server's delay, rounded up to the second; else the zero Time.
// A journal whose clock cannot be read parks nothing: the entry is then
// pending as any other.
func (a *operation) parkUntil(ctx context.Context, err error) time.Time {
	var g *GiveUpError
	if !errors.Is(err, ErrRetryAfterTooLong) || !errors.As(err, &g) || g.RetryAfter <= 0 {
		return time.Time{}
	}
	now, jerr := a.c.journalNow(context.WithoutCancel(ctx), a.j)
	if jerr != nil {
		return time.Time{}
	}
	t := now.Round(0).Add(g.RetryAfter)
	if r := t.Truncate(time.Second); r.Before(t) {
		t = r.Add(time.Second)
	}
	return t
}

// finishPending writes the pending outcome of a call that ended with err,
// and returns the error the call reports. A call the server asked to come
// back later than it waits parks the entry until then (its NotBefore),
// and reports a *ParkedError once that is written: judge sends it from
// then on only. Through StandardClient the give-up went back to the SDK
// as its response (passErr): the entry is parked all the same, and
// ResponseInfo reports the park.
func (a *operation) finishPending(ctx context.Context, err error) error {
	giveUp := err
	if giveUp == nil && a.passedThrough {
		giveUp = a.passErr
	}
	a.notBefore = a.parkUntil(ctx, giveUp)
	if werr := a.writeFinish(ctx, StatePending, nil); werr != nil || a.notBefore.IsZero() {
		return err
	}
	e := a.entry
	parked := &ParkedError{Operation: e.Operation, Key: e.Key, NotBefore: a.notBefore, Expires: e.Created.Add(a.p.retention), Err: giveUp}
	if err == nil {
		a.passErr = parked
		return nil
	}
	return parked
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
	// The answer the outcome is decided on: through StandardClient, a
	// give-up handed to the SDK as its last response is still that
	// give-up, and settles the entry as Do's error would.
	ansResp, ansErr := resp, err
	if a.passedThrough {
		ansResp, ansErr = nil, a.passErr
	}
	to := a.outcome(ansResp, ansErr)
	a.advance(to)
	gone := true // nothing of the call is left in a journal that Resume would send
	if a.entry != nil {
		err, gone = a.settleEntry(ctx, to, ansResp, err)
	}
	if err != nil && !a.reached && gone && (!a.keyed || a.fresh) {
		// Nothing left, on the wire nor in the journal, under a key minted
		// for this call (no other call can have used it) or none: trying
		// again under a new key is safe. A caller's key, or a journal's,
		// may have been used by an earlier call; an entry the journal
		// failed to withdraw, or that another sender holds, may yet be
		// sent: then the call cannot say so.
		err = a.notSent(err)
	}
	return a.end(resp, err)
}

// settleEntry writes the call's outcome, to, to its journal entry:
// settle's part for a call with one. ansResp is the answer the outcome
// was decided on; err, the call's error, is returned as the call returns
// it; gone reports that nothing of the call is left in the journal that
// Resume would send.
//
//go:noinline
func (a *operation) settleEntry(ctx context.Context, to phase, ansResp *http.Response, err error) (_ error, gone bool) {
	gone = true
	switch to {
	case phaseDone:
		var r *Result
		if ansResp != nil && a.p.keepResults > 0 {
			r = keepResult(ansResp, a.p.keepResults, a.p.redactQuery, a.p.redactPath)
		}
		a.writeFinish(ctx, StateDone, r)
	case phasePending:
		gone = false
		err = a.keptUnsent(a.finishPending(ctx, err))
	case phaseWithdrawn:
		var held *heldElsewhereError
		if gone, held = a.withdraw(ctx); held != nil && err != nil {
			held.err, err = err, held
		}
	}
	return err, gone
}

// unwind ends a call that a panic is leaving (proceed's deferred exit): a
// panic in a hook, a caller's callback or a journal frees the call's
// slots and settles its entry as any end of the call would, with what it
// saw so far, so that nothing wedges the operation for the life of the
// process. An entry the call created and never sent is withdrawn; one
// that may have been sent stays pending, for Resume.
func (a *operation) unwind(ctx context.Context) {
	if r := a.lastResp; r != nil && r.Body != nil && !a.returned {
		_ = r.Body.Close() // nobody else will: its connection would leak
	}
	if a.settled || plant.PanicSlot { // a planted bug (internal/plant), false but in a test build
		return
	}
	switch a.phase {
	case phaseMinted:
		if a.entry == nil || !a.created {
			a.settled = true
			a.releaseAll()
			return
		}
		a.advance(phaseJournaled) // Begin wrote the entry; its hook panicked
	case phaseJournaled, phaseAttempting, phaseNotSent, phaseMaybeSent:
		// The attempt the panic interrupted (in the caller's
		// RoundTripper, CheckRedirect or Jar, the Pacer's Observe) was
		// never judged by checkRetry: what its connection saw so far
		// says whether it may have left, as it would have there.
		if w := a.wire.take(); !w.notSent(a.cfg.traceable) {
			a.sawAttempt(true)
		}
	default: // a final phase: its outcome is written
		a.settled = true
		a.releaseAll()
		return
	}
	_, _ = a.settle(ctx, nil, errPanicked)
}

// errPanicked is the error a call that a panic left settles with; nobody
// sees it but the hooks, since the panic goes on.
var errPanicked = errors.New("idemhttp: the call panicked")

// outcome decides where a call that ran ends: the wire evidence first (a
// call whose every attempt provably sent nothing withdraws the entry it
// created), then the answer.
func (a *operation) outcome(resp *http.Response, err error) phase {
	if !a.reached {
		if a.entry == nil || a.created && a.mayWithdraw() {
			return phaseWithdrawn
		}
		// An earlier call or run may have sent it; or the journal's other
		// senders are out of the client's sight (journal_identity.go).
		return phasePending
	}
	switch {
	case err == nil && resp != nil && resp.StatusCode >= 300 && resp.StatusCode < 400 && !plant.RedirectDone:
		// A 3xx returned, whoever left it unfollowed (the client's rules,
		// the caller's CheckRedirect, http.ErrUseLastResponse, a Location
		// net/http cannot follow): nothing ran at its target. (The planted
		// bugs of internal/plant are false but in a test build.)
		return phasePending
	case err == nil && resp != nil && notApplied(resp):
		return phasePending
	case err == nil, errors.Is(err, ErrKeyMismatch), errors.Is(err, ErrKeyRequired):
		return phaseDone
	case plant.GiveUpDone && errors.Is(err, ErrExhausted):
		return phaseDone
	}
	return phasePending
}

// notApplied reports a response whose status says the server did not
// apply the request, so that a resend under the key may still run the
// operation (RFC 9110 §15.5): 401 and 407 (no valid credentials: what a
// Resume without PrepareRequest meets, since the journal keeps none), 408
// (the request did not arrive whole), 421 (the wrong server) and 425 (too
// early, RFC 8470). Settled done, it would lose the operation: a rerun
// would be told it is done. A replay is the server's stored answer, and
// final.
func notApplied(resp *http.Response) bool {
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusProxyAuthRequired, http.StatusRequestTimeout, http.StatusMisdirectedRequest, http.StatusTooEarly:
		return !Replayed(resp)
	}
	return false
}

// writeFinish records the call's outcome. A failure cannot change the
// call's result (the request already went out), and leaves the entry
// pending, which Resume resolves by resending with the same key; so it is
// logged, and returned only for settle to know whether a park was
// recorded. ErrFenced means another sender finished or holds the entry:
// its outcome is the one that counts.
func (a *operation) writeFinish(ctx context.Context, s State, r *Result) error {
	c, e := a.c, a.entry
	t0 := c.journalClock()
	err := a.j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: s, Status: a.lastStatus, Attempts: a.attempts, At: c.stamp(a.j), Result: r, NotBefore: a.notBefore})
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalFinish, Key: e.Key, Operation: e.Operation, State: string(s), Err: err}, t0)
	if err != nil && c.cfg.logger != nil {
		level, msg := slog.LevelWarn, "idemhttp: journal finish failed; entry stays pending"
		if errors.Is(err, ErrFenced) {
			level, msg = slog.LevelInfo, "idemhttp: journal entry finished or held by another sender; left to it"
		}
		c.cfg.logger.LogAttrs(ctx, level, msg, contract.LogKey(e.Key, c.cfg.logKeys), slog.String("state", string(s)), c.errAttr(err, e.Key))
	}
	return err
}

// withdraw removes the entry of a call that created it and provably sent
// nothing, so that Resume never sends a request its caller was told did
// not go out. Should the removal fail, the entry is marked abandoned
// instead: Resume never sends either. It reports whether nothing of the
// call is left that Resume would send: false when both writes failed, and
// the entry stays pending, and false when the journal refused the
// withdrawal by fencing (ErrFenced: another sender finished the entry, or
// holds it, and may have sent it); held then says what is known.
func (a *operation) withdraw(ctx context.Context) (gone bool, held *heldElsewhereError) {
	c, e := a.c, a.entry
	ctx = context.WithoutCancel(ctx)
	t0 := c.journalClock()
	err := a.j.Delete(ctx, e.Key)
	switch {
	case err == nil, errors.Is(err, ErrNotFound):
		c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: e.Key, Operation: e.Operation}, t0)
		return true, nil
	case errors.Is(err, ErrFenced):
		c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: e.Key, Operation: e.Operation, Err: err}, t0)
		h := &heldElsewhereError{key: e.Key, operation: e.Operation, fence: err}
		if cur, gerr := a.j.Get(ctx, e.Key); gerr == nil {
			h.state = cur.State
		}
		return false, h
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
		c.cfg.logger.LogAttrs(ctx, slog.LevelError, msg, contract.LogKey(e.Key, c.cfg.logKeys), c.errAttr(errors.Join(err, err2), e.Key))
	}
	return err2 == nil, nil
}

// heldElsewhereError is the error of a call that sent nothing but whose
// entry the journal would not let it withdraw (ErrFenced): another
// sender (a worker of a fleet sharing the journal) finished the entry or
// holds it, and may have sent the operation. The call's own error stays
// reachable; the error matches ErrFenced, and never ErrNotSent.
type heldElsewhereError struct {
	err       error
	key       string
	operation string
	state     State // the entry's state as read after the refusal; "" if unread
	fence     error // the journal's refusal
}

func (h *heldElsewhereError) Error() string {
	state := "unknown"
	if h.state != "" {
		state = string(h.state)
	}
	return fmt.Sprintf("%v; nothing was sent by this call, but the journal refused to withdraw its entry (operation %q, key %s, now %s): %v: another sender may have sent it; do not retry under a new key",
		h.err, h.operation, h.key, state, h.fence)
}

func (h *heldElsewhereError) Unwrap() []error { return []error{h.err, h.fence} }

// writeAbandoned marks an entry past the retention abandoned.
func (a *operation) writeAbandoned(ctx context.Context, e *Entry) {
	c := a.c
	err := a.j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: StateAbandoned, Status: e.LastStatus, At: c.stamp(a.j)})
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalFinish, Key: e.Key, Operation: e.Operation, State: string(StateAbandoned), Err: err}, time.Time{})
	if err != nil && !errors.Is(err, ErrFenced) && c.cfg.logger != nil {
		c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemhttp: journal: could not mark an expired entry abandoned", contract.LogKey(e.Key, c.cfg.logKeys), c.errAttr(err, e.Key))
	}
}

// errAttr is the error attribute of a log record about key: err's text,
// the key in it named by its digest unless LogKeys (the journals' errors
// name the key they were given).
func (c *Client) errAttr(err error, key string) slog.Attr {
	return slog.String("error", contract.RedactKey(err.Error(), key, c.cfg.logKeys))
}
