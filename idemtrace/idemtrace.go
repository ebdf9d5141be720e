// Package idemtrace defines the events an idemhttp Client
// reports at each decision of a call (attempts, retries, give-ups, budget
// refusals, journal writes), for metrics, traces and audit logs, as
// net/http/httptrace does for one request's connection. Set them with the
// Client's Hooks field; contrib/otel turns them into OpenTelemetry spans
// and metrics. The package has no dependency on the client, so that an
// observability library can import it alone.
package idemtrace

import (
	"context"
	"net/http"
	"time"
)

// Hooks are functions a [github.com/idemkit/idemhttp.Client] calls at each decision of a call, for
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

	// OnRetry is called before each retry's wait.
	OnRetry func(ctx context.Context, ev RetryEvent)

	// OnBudgetRefused is called when the retry budget cannot pay for a
	// retry the policy wanted; OnGiveUp follows with [ErrBudgetExhausted].
	OnBudgetRefused func(ctx context.Context, ev BudgetEvent)

	// OnGiveUp is called when the call stops retrying with a
	// *idemhttp.GiveUpError, which the event carries.
	OnGiveUp func(ctx context.Context, ev GiveUpEvent)

	// OnCallDone is called once when the call returns.
	OnCallDone func(ctx context.Context, ev CallDoneEvent)

	// OnJournal is called after each journal operation a call or a
	// Client.Resume makes: begin, finish, discard and resume. It gets
	// the caller's context, not the call's: begin comes before
	// OnCallStart.
	OnJournal func(ctx context.Context, ev JournalEvent)
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
	Err error // what Do returns: a *idemhttp.GiveUpError, whose Reason says why
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
	State     string        // the state written (finish), or the entry's state: "pending", "done" or "abandoned"
	Existing  bool          // begin: the journal already held the operation's entry
	Err       error         // the journal's error, nil on success
	Latency   time.Duration // how long the journal took
}

// RetryEvent describes a retry about to happen. See [Hooks.OnRetry].
type RetryEvent struct {
	Method    string        // request method
	URL       string        // request URL, with its password and secret query values redacted
	Key       string        // idempotency key, "" if none
	Operation string        // operation id, "" if none
	Attempt   int           // number of the attempt about to be made (2 for the first retry)
	Delay     time.Duration // wait before it
	Reason    RetryReason   // why the previous attempt is retried
	Status    int           // status of the previous attempt, 0 if it got no response
	Err       error         // error of the previous attempt, nil if it got a response
}

// RetryReason says why an attempt is retried. It appears in [RetryEvent]
// and logs.
type RetryReason string

// The reasons a call is retried.
const (
	ReasonInProgress     RetryReason = "in_progress"     // 409: the first request with the key is still running on the server
	ReasonRateLimited    RetryReason = "rate_limited"    // 429
	ReasonUnavailable    RetryReason = "unavailable"     // 503
	ReasonServerError    RetryReason = "server_error"    // 500, 502, 504
	ReasonShouldRetry    RetryReason = "should_retry"    // Stripe-Should-Retry: true
	ReasonNotSent        RetryReason = "not_sent"        // no request head was written: refused, DNS, TLS handshake
	ReasonUnknownOutcome RetryReason = "unknown_outcome" // timeout, reset or EOF after sending
	ReasonClassified     RetryReason = "classified"      // Policy.Classify asked for it
)
