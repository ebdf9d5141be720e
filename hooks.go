package idemhttp

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"

	"github.com/hashicorp/go-retryablehttp"
)

// Hooks are functions a [Client] calls at each decision of a call, for
// metrics, traces and audit logs (contrib/otel builds on them). Every
// field may be nil; a Client whose Hooks is nil, or whose Hooks has no
// function set, pays nothing for them: no event is built.
//
// Every hook runs on the goroutine of the call it describes, synchronously,
// so the events of one call arrive in order: OnCallStart, then per attempt
// OnAttempt and OnAttemptDone, then OnRetry (or OnBudgetRefused and
// OnGiveUp), and last OnCallDone. OnJournal arrives around them as the
// journal is written. Hooks must not block and must not keep the
// *http.Response or *http.Request an event carries: both belong to the
// call. The ctx each gets is the call's (carrying the caller's values and
// whatever OnCallStart added); it is not for blocking on.
//
// Events carry the request's URL with its password and secret query values
// redacted, and the idempotency key, which is not a credential but does
// identify an operation: a hook that exports it decides whether it should.
type Hooks struct {
	// OnCallStart is called once per call that reaches its first attempt's
	// preparation (after the key is chosen and the journal entry written).
	// The context it returns, if not nil, becomes the call's context: the
	// attempts are sent with it and every later hook of the call gets it,
	// so a tracer can put the call's span in it. Every call that got
	// OnCallStart gets OnCallDone, unless PrepareRequest panics. A call
	// refused before this point (an invalid key, a body that cannot be
	// replayed, a journal error) gets neither: see OnJournal for the
	// journal's errors.
	OnCallStart func(ctx context.Context, ev CallEvent) context.Context

	// OnAttempt is called just before each attempt is sent.
	OnAttempt func(ctx context.Context, ev AttemptEvent)

	// OnAttemptDone is called when an attempt's response headers (or its
	// error) arrive, before the policy decides what to do with it.
	OnAttemptDone func(ctx context.Context, ev AttemptDoneEvent)

	// OnRetry is called before each retry's wait. [Client.OnRetry] is a
	// shorthand for it; both are called when both are set.
	OnRetry func(ctx context.Context, ev RetryEvent)

	// OnBudgetRefused is called when the retry budget cannot pay for a
	// retry the policy wanted; OnGiveUp follows with [ErrBudgetExhausted].
	OnBudgetRefused func(ctx context.Context, ev BudgetEvent)

	// OnGiveUp is called when the call stops retrying with a
	// [*GiveUpError], which the event carries.
	OnGiveUp func(ctx context.Context, ev GiveUpEvent)

	// OnCallDone is called once when the call returns.
	OnCallDone func(ctx context.Context, ev CallDoneEvent)

	// OnJournal is called after each journal operation a call or a
	// [Client.Resume] makes: begin, finish, discard and resume. It gets
	// the caller's context, not the call's: begin comes before
	// OnCallStart.
	OnJournal func(ctx context.Context, ev JournalEvent)
}

// set reports whether any hook is set.
func (h *Hooks) set() bool {
	return h != nil && (h.OnCallStart != nil || h.OnAttempt != nil || h.OnAttemptDone != nil ||
		h.OnRetry != nil || h.OnBudgetRefused != nil || h.OnGiveUp != nil || h.OnCallDone != nil || h.OnJournal != nil)
}

// CallEvent identifies a call; every call event embeds it.
type CallEvent struct {
	Method    string // request method
	URL       string // request URL, with its password and secret query values redacted
	Key       string // idempotency key sent, "" if none
	Operation string // operation id from WithOperation, "" if none
}

// AttemptEvent describes an attempt about to be sent. See [Hooks.OnAttempt].
type AttemptEvent struct {
	CallEvent
	Attempt int // 1 for the first attempt; Attempt-1 is the resend count
}

// ErrorClass sorts a failed attempt by what it says about the server side.
type ErrorClass string

// The classes of [AttemptDoneEvent.Class].
const (
	ClassNone      ErrorClass = ""                // the attempt got a response
	ClassNotSent   ErrorClass = "not_sent"        // the request certainly never left: safe to resend with any method
	ClassUnknown   ErrorClass = "unknown_outcome" // the request may have reached the server and run
	ClassPermanent ErrorClass = "permanent"       // a failure no retry can fix (a refused certificate, a refused redirect, a request net/http would not send)
	ClassCanceled  ErrorClass = "canceled"        // the call's context ended
)

// AttemptDoneEvent describes an attempt's outcome. See [Hooks.OnAttemptDone].
type AttemptDoneEvent struct {
	CallEvent
	Attempt  int            // as in AttemptEvent
	Status   int            // response status, 0 if none
	Response *http.Response // the response, nil if none; do not read its body or keep it
	Err      error          // the attempt's error, nil if it got a response
	Class    ErrorClass     // for an error, what it says about the server side
	Latency  time.Duration  // from sending to the response headers or the error
}

// BudgetEvent describes a retry the budget refused. See [Hooks.OnBudgetRefused].
type BudgetEvent struct {
	CallEvent
	Attempts int   // attempts made
	Cost     int64 // tokens the retry would have cost
	Tokens   int64 // tokens left in the bucket
}

// GiveUpEvent describes a call that stopped retrying. See [Hooks.OnGiveUp].
type GiveUpEvent struct {
	CallEvent
	Err *GiveUpError // what Do returns; Err.Reason says why
}

// CallDoneEvent describes a call's result. See [Hooks.OnCallDone].
type CallDoneEvent struct {
	CallEvent
	Attempts int           // attempts made, the first included
	Status   int           // status of the response returned (or of the last one), 0 if none
	Err      error         // what Do returns, nil with a response
	Replayed bool          // the response returned is a replay
	Duration time.Duration // from OnCallStart to the return
}

// JournalOp names a journal operation in a [JournalEvent].
type JournalOp string

// The journal operations reported to [Hooks.OnJournal].
const (
	JournalBegin   JournalOp = "begin"   // a call recorded its pending entry (or found the operation's)
	JournalFinish  JournalOp = "finish"  // a call recorded its outcome
	JournalDiscard JournalOp = "discard" // a call that sent nothing withdrew its entry
	JournalResume  JournalOp = "resume"  // Resume is about to resend a pending entry (or to abandon an expired one)
)

// JournalEvent describes a journal operation. See [Hooks.OnJournal].
type JournalEvent struct {
	Op        JournalOp
	Key       string        // the entry's key ("" when Begin failed before choosing)
	Operation string        // the entry's operation id, "" if none
	State     State         // the state written (finish), or the entry's state
	Existing  bool          // begin: the journal already held the operation's entry
	Err       error         // the journal's error, nil on success
	Latency   time.Duration // how long the journal took
}

// call returns the event identity of a.
func (a *attempt) call() CallEvent {
	if a.redURL == "" {
		a.redURL = contract.RedactURL(a.req.URL, a.p.redactQuery)
	}
	return CallEvent{Method: a.req.Method, URL: a.redURL, Key: a.key, Operation: a.operation}
}

// hookCtx is the context hooks get: the call's.
func (a *attempt) hookCtx() context.Context { return &a.cctx }

// engineRequestHook is the engine's RequestLogHook, installed only on calls
// with attempt hooks: it times the attempt and reports its start.
func engineRequestHook(_ retryablehttp.Logger, r *http.Request, _ int) {
	a := attemptFrom(r.Context())
	if a == nil {
		return
	}
	a.attemptStart = time.Now()
	if h := &a.cfg.hooks; h.OnAttempt != nil {
		h.OnAttempt(a.hookCtx(), AttemptEvent{CallEvent: a.call(), Attempt: a.attempts + 1})
	}
}

// attemptDone reports an attempt's outcome.
func (a *attempt) attemptDone(resp *http.Response, err error, class ErrorClass) {
	h := &a.cfg.hooks
	if h.OnAttemptDone == nil {
		return
	}
	ev := AttemptDoneEvent{CallEvent: a.call(), Attempt: a.attempts, Err: err, Class: class}
	if !a.attemptStart.IsZero() {
		ev.Latency = time.Since(a.attemptStart)
	}
	if err == nil && resp != nil {
		ev.Status, ev.Response = resp.StatusCode, resp
	}
	h.OnAttemptDone(a.hookCtx(), ev)
}

// callStart reports the call's start and returns the call's context.
func (a *attempt) callStart(ctx context.Context) context.Context {
	h := &a.cfg.hooks
	if h.OnCallStart == nil && h.OnCallDone == nil {
		return ctx
	}
	a.callStarted = time.Now()
	if h.OnCallStart != nil {
		if nc := h.OnCallStart(ctx, a.call()); nc != nil {
			ctx = nc
		}
	}
	return ctx
}

// end reports the call's result and returns it unchanged.
func (a *attempt) end(resp *http.Response, err error) (*http.Response, error) {
	h := &a.cfg.hooks
	if h.OnCallDone == nil {
		return resp, err
	}
	ev := CallDoneEvent{CallEvent: a.call(), Attempts: a.attempts, Status: a.lastStatus, Err: err, Duration: time.Since(a.callStarted)}
	if resp != nil {
		ev.Status, ev.Replayed = resp.StatusCode, Replayed(resp)
	}
	h.OnCallDone(a.hookCtx(), ev)
	return resp, err
}

// journalEvent reports a journal operation.
func (c *Client) journalEvent(ctx context.Context, ev JournalEvent, start time.Time) {
	if f := c.cfg.hooks.OnJournal; f != nil {
		if !start.IsZero() {
			ev.Latency = time.Since(start)
		}
		f(ctx, ev)
	}
}

// journalClock returns the start time of a journal operation when a hook
// will want its latency, and the zero time (no clock read) otherwise.
func (c *Client) journalClock() time.Time {
	if c.cfg.hooks.OnJournal == nil {
		return time.Time{}
	}
	return time.Now()
}
