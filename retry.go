package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/plant"

	"github.com/cenkalti/backoff/v4"
)

// This file is the attempt loop. Its retries run on go-retryablehttp's
// engine (Client.Do: body rewind per attempt, bounded drain of discarded
// bodies, the timer and context select) with our own CheckRetry, Backoff,
// PrepareRetry and ErrorHandler; the first attempt goes out directly, as
// the engine's loop would send it, and a retry hands the call over to the
// engine (send.go). Three parts of the engine cannot express the
// contract, and are wrapped:
//
//   - Deadline: the engine sleeps first and notices the deadline after.
//     CheckRetry decides the delay itself and, when the wait would cross the
//     deadline or exceed MaxRetryAfter, stops the loop at once with a typed
//     error; Backoff only returns that delay.
//   - Typed final errors: the engine formats "giving up after N attempt(s)"
//     strings and returns a bare ctx.Err() when a wait is cancelled. Every
//     stop goes through CheckRetry or ErrorHandler, which build
//     *GiveUpError/*KeyMismatchError from the call's state, and a cancelled
//     wait is rewrapped with the last attempt's error in finish.
//   - CloseIdleConnections: the engine calls it on the http.Client on every
//     failure, which would tear down the pooled connections of a caller's
//     shared client. The engine gets its own http.Client value whose
//     Transport hides CloseIdleConnections (attemptTransport, client.go).

// peekLen bounds how much of a 4xx body is read to recognise an
// idempotency signal.
const peekLen = 4 << 10

// operation is the state of one call of an operation across its attempts:
// its lifecycle (lifecycle.go) and the attempt loop's bookkeeping. It
// rides in the outgoing request's context (callCtx), which is how the
// engine's hooks (plain functions, so a call allocates no closures for
// them), the redirect policy and ResponseInfo find it.
type operation struct {
	c    *Client
	cfg  *config
	p    *policy
	req  *http.Request // the outgoing request, for logging and events
	cctx callCtx

	key       string    // idempotency key sent, "" if none
	keyVal    [1]string // the key header's value slice, allocated with the call
	operation string    // operation id, "" if none
	attempts  int       // attempts made so far
	conflicts int       // retries after an in-progress 409; not counted against MaxAttempts
	since     time.Time // first in-progress 409 of the call
	// waitingOut: the latest retry waits out a 409 in progress, so a
	// context that ends now ends an in-progress wait.
	waitingOut bool

	keyed   bool // carries a key: retries are safe whatever the method
	safe    bool // keyed or an idempotent method
	fresh   bool // the key was minted for this call: the server cannot have seen it before the first attempt
	resent  bool // net/http resent an attempt by itself, or may have unseen: the key may have been seen
	unknown bool // an attempt may have reached the server without an answer reaching us

	// The lifecycle (lifecycle.go).
	phase         phase
	badMoves      [][2]phase // moves the lifecycle refused: a bug
	held          []slotID   // the senders' slots this call holds
	scope         any        // the scope of its slots: its journal's (config.scope)
	created       bool       // the journal entry is this call's own
	reached       bool       // an attempt may have reached a server (or got an answer)
	settled       bool       // the outcome is written (or the call was answered locally)
	sdk           bool       // StandardClient's transport: a final give-up's last response goes back
	passedThrough bool       // sdk: the response returned is a give-up's (passErr)
	passErr       error
	fromJournal   bool      // the response is the journal's copy of the result
	notBefore     time.Time // settle: the entry is parked until then (the server's Retry-After)

	lastStatus int
	lastErr    error
	paceErr    error // the Pacer refused the current attempt (Wait's error)
	// lastResp is the latest response the transport handed up, which a panic
	// (a hook's, CheckRedirect's) may leave unclosed: unwind closes it.
	lastResp   *http.Response
	returned   bool // the call is returning its result (end ran), not panicking
	retryAfter time.Duration
	lastCost   int64 // budget tokens the latest retry withdrew
	waiting    bool  // a retry was decided and its wait has not ended
	bo         *backoff.ExponentialBackOff
	retries    int // the backoffs Policy.Backoff gave
	origStatus int // the server's status when the policy rewrote it

	// The last response that a retry's wait drained, for a give-up
	// during that wait (GiveUpError.Header, Body): kept at attempt
	// keptAt, raw (filtered when an error takes it).
	keptAt      int
	keptHeader  http.Header
	keptBody    []byte
	keptBodyCut bool

	// What the connection saw during the current attempt (wire.go).
	trace httptrace.ClientTrace
	wire  wireTally

	j     Journal // the journal holding entry, nil if none
	entry *Entry

	// The body (body.go): one in memory, sent whole by every attempt; or a
	// streamed one, with GetBody. probing is set while the engine measures
	// the body.
	mem       memBody
	catcher   stringCatcher // replayableBody's scratch
	memReader bytes.Reader
	strReader strings.Reader
	memUsed   bool
	stream    *streamed
	getBody   func() (io.ReadCloser, error) // a streamed body's GetBody (replayableBody), nil if in memory
	hc        headerCopy                    // do: the header copied by callerKey, if it was
	openBody  *http.Request                 // proceed: the request whose streamed body the call must close if it stops before sending
	bodyLen   int64                         // the body's length as sent, 0 if none, -1 if unknown
	probing   bool

	// The first attempt goes out directly (send.go); eng, go-retryablehttp's
	// engine, is made only for a retry. delay is the wait before the next
	// attempt, which checkRetry decides.
	eng    *retryEngine
	delay  time.Duration
	replay *http.Response // send: the response http.Client gets for a redirect it follows from

	// For hooks only (hooks.go): the redacted URL, computed once, and
	// when the call and the current attempt started.
	redURL       string
	callStarted  time.Time
	attemptStart time.Time
}

// callCtx is the outgoing request's context: the caller's, plus the call
// state, in a value that lives inside the attempt rather than in one more
// allocation per call.
type callCtx struct {
	context.Context
	a *operation
}

// Value returns the call state for callCtxKey and defers to the caller's
// context for every other key.
func (c *callCtx) Value(key any) any {
	if k, ok := key.(ctxKey); ok && k == callCtxKey {
		return c.a
	}
	return c.Context.Value(key)
}

// context returns the outgoing request's context: parent with the call
// state and the trace that tells whether an attempt reached the wire.
// httptrace composes it with any trace the caller installed.
func (a *operation) context(parent context.Context) context.Context {
	a.wire.install(&a.trace, a.cfg.h2c || !isHTTP(a.req.URL.Scheme), a.cfg.h2c)
	a.cctx = callCtx{Context: httptrace.WithClientTrace(parent, &a.trace), a: a}
	return &a.cctx
}

// handOver is called as an attempt (or a redirect hop of it) is handed to
// the caller's RoundTripper: it refuses an attempt the Pacer refused, or
// whose context has ended, and otherwise counts it as handed, the
// evidence that it may have left (wire.go).
func (a *operation) handOver(r *http.Request) error {
	if a.paceErr != nil {
		return a.paceErr
	}
	if err := r.Context().Err(); err != nil {
		return err
	}
	a.wire.handed.Add(1)
	return nil
}

// attemptFrom returns the call state riding in ctx.
func attemptFrom(ctx context.Context) *operation {
	a, _ := ctx.Value(callCtxKey).(*operation)
	return a
}

// The engine's hooks. Each finds its call through the request context;
// the delay travels in the engine's RetryWaitMin, which checkRetry sets.
var (
	engineCheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		return attemptFrom(ctx).checkRetry(ctx, resp, err)
	}
	engineBackoff = func(delay, _ time.Duration, _ int, _ *http.Response) time.Duration {
		return delay
	}
	enginePrepareRetry = func(r *http.Request) error {
		a := attemptFrom(r.Context())
		a.waiting = false
		if plant.RetryNewKey { // a planted bug (internal/plant), false but in a test build
			r.Header[a.p.keyHeader] = []string{plant.RetryKey(a.key, a.attempts)}
		}
		return nil
	}
)

// Info describes how a response was obtained. See [ResponseInfo].
type Info struct {
	Key       string // idempotency key sent, "" if none
	Operation string // operation id from WithOperation, "" if none
	Attempts  int    // attempts made, the first included; see below

	Replayed bool // the server replayed a stored response

	// UnknownOutcome: an earlier attempt may have reached the server and
	// run, but its answer was lost (a timeout or a reset after the
	// request was written). A 404 to a retried DELETE then most likely
	// means the earlier attempt deleted it.
	UnknownOutcome bool

	// OriginalStatus is the server's status when the policy rewrote it
	// ([Policy.RetriedDeleteNotFoundOK]); 0 otherwise.
	OriginalStatus int

	// FromJournal: nothing was sent; the response is the result the
	// journal kept for the done operation ([Policy.KeepResults]).
	FromJournal bool

	// Err is the error the client gave up with when, through
	// [Client.StandardClient], it handed an SDK the last response instead
	// (a [*GiveUpError] or a [*KeyMismatchError]); nil otherwise.
	Err error
}

// ResponseInfo reports the key, operation, attempt count and replay flag of
// a response returned by [Client.Do] (or by a [Client.StandardClient]). ok
// is false for a response that did not come through a Client.
//
// Attempts counts the attempts idemhttp made. Within one attempt,
// net/http's Transport may itself resend a request that carries an
// Idempotency-Key header once, when a reused pooled connection turns out
// to be dead; that resend is safe (same key, same body) and not counted,
// though the client takes it into account when it reads a 409 or 422.
func ResponseInfo(resp *http.Response) (info Info, ok bool) {
	if resp == nil || resp.Request == nil {
		return Info{}, false
	}
	a := attemptFrom(resp.Request.Context())
	if a == nil {
		return Info{}, false
	}
	return Info{
		Key: a.key, Operation: a.operation, Attempts: a.attempts, Replayed: Replayed(resp),
		UnknownOutcome: a.unknown, OriginalStatus: a.origStatus, FromJournal: a.fromJournal, Err: a.passErr,
	}, true
}

// checkRetry is the engine's CheckRetry: it classifies the attempt, decides
// whether to retry, and computes the wait.
func (a *operation) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	a.attempts++
	a.waiting = false
	if a.paceErr != nil {
		return a.paceRefused(ctx)
	}
	if a.p.pacer != nil {
		a.observe(resp)
	}
	w := a.wire.take()
	if w.writes > 1 || !a.cfg.traceable || w.writes == 0 {
		// net/http resent it by itself (more than one head written), or
		// nobody can tell: a Transport whose events the client cannot see
		// (a RoundTripper of the caller's, a registered protocol, a
		// wrapper that drops the trace) may have resent it unseen. Either
		// way the key may have been seen before this answer, and a 409 to
		// it may be the first write's request in progress, not the
		// application's answer (the simulator's seed 17790).
		a.resent = true
	}
	if err != nil {
		err = a.redact(err)
	}
	if plant.ResetNotSent && resp == nil && plant.IsReset(err) { // a planted bug (internal/plant)
		w.writes = 0
	}
	if plant.ClassifiedNotSent && resp == nil && err != nil && a.p.classify != nil { // a planted bug (internal/plant)
		if v := a.p.classify(nil, err); v == VerdictRetry || v == VerdictRetryUnsafe {
			w.writes = 0
		}
	}
	// The lifecycle's evidence: whether this attempt can have reached the
	// server (wire.go). An answer always did.
	a.sawAttempt(resp != nil || !w.notSent(a.cfg.traceable))
	if a.stream != nil && a.stream.ref.differed() {
		return a.bodyChanged(resp, err)
	}
	if err != nil {
		return a.checkError(ctx, resp, err, w)
	}

	a.lastStatus, a.lastErr = resp.StatusCode, nil
	a.attemptDone(resp, nil, idemtrace.ClassNone)
	sig := signals{keyed: a.keyed, safe: a.safe, fresh: a.fresh && a.attempts == 1 && !a.resent}
	var peeked []byte
	didPeek := false
	peek := func() []byte {
		if !didPeek {
			peeked, didPeek = peekBody(resp), true
		}
		return peeked
	}
	v, reason := a.p.classifyResponse(resp, sig, peek)
	switch v {
	case vRetry:
		return a.retry(ctx, reason, resp, false)
	case vInProgress:
		return a.retryInProgress(ctx, resp)
	case vMismatch:
		return false, &KeyMismatchError{Key: a.key, StatusCode: resp.StatusCode, Body: a.snippet(resp)}
	case vKeyRequired:
		return false, a.giveUp(ErrKeyRequired, resp)
	}
	if resp.StatusCode < 300 {
		// AWS retry-quota semantics: a success refunds what the retry that
		// succeeded cost, never the earlier failed retries, and a success
		// at the first attempt adds one token. Refunding a whole call's
		// retries would let a brownout (most attempts failing, each call
		// succeeding at last) keep the bucket full forever.
		switch {
		case a.lastCost > 0:
			a.cfg.budget.deposit(a.lastCost)
		case a.attempts == 1:
			a.cfg.budget.deposit(1)
		}
	}
	if resp.StatusCode == http.StatusNotFound && a.unknown && a.p.deleteGoneOK && a.req.Method == http.MethodDelete {
		a.rewriteGone(resp)
	}
	return false, nil
}

// paceRefused is checkRetry of an attempt the Pacer refused, which was
// never handed to the transport (handOver): it left nothing, and is no
// attempt.
//
//go:noinline
func (a *operation) paceRefused(ctx context.Context) (bool, error) {
	refused := a.paceErr
	a.paceErr = nil
	a.attempts--
	a.wire.take()
	a.sawAttempt(false)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return false, a.stopped(ctxErr)
	}
	return false, a.giveUpJoin(ErrPacerRefused, refused, nil)
}

// observe tells the Pacer how the attempt was answered (0: not at all).
//
//go:noinline
func (a *operation) observe(resp *http.Response) {
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	a.p.pacer.Observe(status, resp != nil && (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != ""))
}

// bodyChanged is checkRetry of an attempt whose body from GetBody was not
// the one sent before: it was cut short (see body.go), and it must not go
// out under this key.
//
//go:noinline
func (a *operation) bodyChanged(resp *http.Response, err error) (bool, error) {
	var last *http.Response // the answer, for the error to carry
	if err == nil {
		a.lastStatus, last = resp.StatusCode, resp
		a.attemptDone(resp, nil, idemtrace.ClassNone)
	} else {
		a.lastStatus, a.lastErr = 0, err
		a.attemptDone(nil, err, idemtrace.ClassUnknown)
	}
	return false, a.giveUp(ErrBodyChanged, last)
}

// checkError is checkRetry of an attempt that failed with err (redacted),
// w being its wire evidence.
//
//go:noinline
func (a *operation) checkError(ctx context.Context, resp *http.Response, err error, w attemptWire) (bool, error) {
	a.lastStatus, a.lastErr = 0, err
	if resp != nil {
		// net/http returns a response with an error only when
		// CheckRedirect refused to follow it: the same request would
		// get the same redirect. The engine hands err back.
		a.attemptDone(nil, err, idemtrace.ClassPermanent)
		return false, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		a.attemptDone(nil, err, idemtrace.ClassCanceled)
		return false, a.stopped(ctxErr)
	}
	class := a.classify(err, w)
	a.attemptDone(nil, err, errClassNames[class])
	if class == errUnknown {
		a.unknown = true
	}
	if c, ok := a.p.classifyError(err, class, a.safe); ok {
		if c == errPermanent {
			return false, nil // the engine hands err back
		}
		return a.retry(ctx, idemtrace.ReasonClassified, nil, isTimeout(err))
	}
	switch class {
	case errPermanent:
		return false, nil // the engine hands err back
	case errNotSent:
		return a.retry(ctx, idemtrace.ReasonNotSent, nil, false)
	}
	if !a.safe {
		// A POST without a key may have run: resending could run it
		// twice. Hand the error back as net/http would.
		return false, nil
	}
	return a.retry(ctx, idemtrace.ReasonUnknownOutcome, nil, isTimeout(err))
}

// rewriteGone reports a 404 to a retried DELETE, whose earlier attempt's
// outcome was unknown, as the 204 that attempt most likely produced.
func (a *operation) rewriteGone(resp *http.Response) {
	drain(resp.Body)
	a.origStatus = resp.StatusCode
	resp.StatusCode, resp.Status = http.StatusNoContent, "204 No Content"
	resp.Body, resp.ContentLength = http.NoBody, 0
	resp.Header.Del("Content-Length")
	resp.Header.Del("Content-Type")
}

// retry decides whether the retry the policy asked for can happen: attempts
// left, a Retry-After within bounds, a wait that ends before the deadline,
// and budget to pay for it.
func (a *operation) retry(ctx context.Context, reason idemtrace.RetryReason, resp *http.Response, timeout bool) (bool, error) {
	hinted := a.hint(resp)
	if hinted && a.retryAfter > a.p.maxRetryAfter {
		// Before the attempts: on the last attempt too, the server's time
		// is what a journaled operation is parked until (settle).
		return false, a.giveUp(ErrRetryAfterTooLong, resp)
	}
	if a.attempts-a.conflicts >= a.p.maxAttempts {
		return false, a.giveUp(ErrExhausted, resp)
	}
	delay := a.backoff()
	if hinted {
		// A Retry-After of 0, or a date in the past, gets the backoff as
		// a floor, as a 409's does: an overloaded server that says "now"
		// to every client must not get a retry storm.
		delay = max(a.retryAfter, delay)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= delay {
		// Sleeping would only end in the context's error: stop now, with
		// the last outcome, instead of holding the caller until then.
		if hinted {
			return false, a.giveUpJoin(ErrRetryAfterTooLong, context.DeadlineExceeded, resp)
		}
		return false, a.giveUp(context.DeadlineExceeded, resp)
	}
	cost, ok := a.cfg.budget.withdraw(timeout)
	if !ok {
		if f := a.cfg.hooks.OnBudgetRefused; f != nil {
			b := a.cfg.budget
			f(a.hookCtx(), idemtrace.BudgetEvent{CallEvent: a.call(), Attempts: a.attempts, Cost: b.costOf(timeout), Tokens: b.tokens.Load()})
		}
		return false, a.giveUp(ErrBudgetExhausted, resp)
	}
	a.lastCost = cost
	a.waitingOut = false
	return a.wait(ctx, reason, resp, delay)
}

// retryInProgress waits out the first request with the same key, which the
// server is still running: the wait is bounded by the policy's in-progress
// patience and the context's deadline, not by MaxAttempts, which a fast
// 409 would use up in milliseconds, and it costs no budget (a duplicate in
// flight is not an overload). A Retry-After of 0, or a date in the past,
// gets BaseDelay as a floor.
func (a *operation) retryInProgress(ctx context.Context, resp *http.Response) (bool, error) {
	now := time.Now()
	if a.since.IsZero() {
		a.since = now
	}
	delay := a.backoff()
	if a.hint(resp) {
		delay = max(a.retryAfter, a.p.baseDelay)
	}
	if now.Sub(a.since)+delay > a.p.inProgressPatience {
		return false, a.giveUp(ErrInProgress, resp)
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= delay {
		return false, a.giveUpJoin(ErrInProgress, context.DeadlineExceeded, resp)
	}
	a.conflicts++
	a.lastCost = 0
	a.waitingOut = true
	return a.wait(ctx, idemtrace.ReasonInProgress, resp, delay)
}

// hint reads resp's Retry-After into a.retryAfter and reports whether it
// had a usable one.
func (a *operation) hint(resp *http.Response) bool {
	a.retryAfter = 0
	if resp == nil {
		return false
	}
	d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	if ok {
		a.retryAfter = d
	}
	return ok
}

// backoff returns the call's next jittered exponential delay.
func (a *operation) backoff() time.Duration {
	if f := a.p.backoffFn; f != nil {
		a.retries++
		return min(max(f(a.retries), 0), a.p.maxDelay) // as documented on Policy.Backoff
	}
	if a.bo == nil {
		a.bo = &backoff.ExponentialBackOff{
			InitialInterval:     a.p.baseDelay,
			RandomizationFactor: 0.5,
			Multiplier:          2,
			MaxInterval:         a.p.maxDelay,
			Stop:                backoff.Stop,
			Clock:               backoff.SystemClock,
		}
		a.bo.Reset()
	}
	return a.bo.NextBackOff()
}

// wait hands the delay to the engine, which sleeps on it, and tells the
// hook and the logger.
func (a *operation) wait(ctx context.Context, reason idemtrace.RetryReason, resp *http.Response, delay time.Duration) (bool, error) {
	if resp != nil {
		// Kept for a give-up during the wait, which has only the call's
		// state to build its error from (GiveUpError.Header and Body).
		// And drained: the engine drains only 4 KiB, with no time bound;
		// a load balancer's error page is often larger, and the
		// connection is worth keeping, but never worth waiting for.
		a.keptAt, a.keptHeader = a.attempts, resp.Header
		a.keptBody, a.keptBodyCut = readErrorBody(a.keptBody, resp.Body, resp.ContentLength, true)
	}
	a.delay = delay
	if a.eng != nil {
		a.eng.engine.RetryWaitMin = delay
	}
	a.waiting = true
	a.c.notifyRetry(ctx, a, reason)
	return true, nil
}

// stopped builds the final error of a call whose context ended. A call
// that was waiting out a 409 in progress stops with ErrInProgress, joined
// to the context's error, whichever of the two noticed first.
func (a *operation) stopped(ctxErr error) *GiveUpError {
	if a.waitingOut {
		return a.giveUpJoin(ErrInProgress, ctxErr, nil)
	}
	return a.giveUp(ctxErr, nil)
}

// giveUp builds the final error of a call that stops retrying.
func (a *operation) giveUp(reason error, resp *http.Response) *GiveUpError {
	return a.giveUpJoin(reason, nil, resp)
}

// giveUpJoin is giveUp with a second cause joined to the last attempt's
// error (the deadline that a Retry-After would have crossed).
func (a *operation) giveUpJoin(reason, also error, resp *http.Response) *GiveUpError {
	e := &GiveUpError{
		Method:     a.req.Method,
		URL:        contract.RedactURL(a.req.URL, a.p.redactQuery, a.p.redactPath),
		Key:        a.key,
		Attempts:   a.attempts,
		LastStatus: a.lastStatus,
		RetryAfter: a.retryAfter,
		Reason:     reason,
		Err:        a.lastErr,
	}
	if also != nil {
		e.Err = errors.Join(a.lastErr, also)
	}
	switch {
	case resp != nil:
		e.Header = a.errorHeader(resp.Header)
		e.Body, e.BodyTruncated = a.errorBody(resp)
	case a.lastStatus != 0 && a.attempts > 0 && a.keptAt == a.attempts:
		// Stopped in the wait after this response (a deadline, a
		// cancellation): the wait kept it.
		e.Header = a.errorHeader(a.keptHeader)
		e.Body, e.BodyTruncated = bytes.Clone(a.keptBody), a.keptBodyCut
	}
	if f := a.cfg.hooks.OnGiveUp; f != nil {
		f(a.hookCtx(), idemtrace.GiveUpEvent{CallEvent: a.call(), Err: e})
	}
	return e
}

// engineErrorHandler is the engine's ErrorHandler: the engine stops here
// with the error checkRetry returned (or the transport error). It closes
// the last response, so a response and an error never travel together;
// but through StandardClient, a give-up on a final status hands that
// response to the SDK, whole, so that it reads its own error body, and
// ResponseInfo carries the error.
func engineErrorHandler(resp *http.Response, err error, _ int) (*http.Response, error) {
	if resp == nil {
		return nil, err
	}
	if a := attemptFrom(resp.Request.Context()); a != nil && a.sdk && passable(err) {
		a.passedThrough, a.passErr = true, err
		return resp, nil
	}
	drain(resp.Body)
	return nil, err
}

// passable reports whether a give-up on a response is one an SDK reads
// better as that response: retries over, a key refused or required.
func passable(err error) bool {
	var g *GiveUpError
	var m *KeyMismatchError
	return errors.As(err, &m) || errors.As(err, &g) && g.LastStatus != 0 &&
		(errors.Is(g.Reason, ErrExhausted) || errors.Is(g.Reason, ErrInProgress) || errors.Is(g.Reason, ErrRetryAfterTooLong) ||
			errors.Is(g.Reason, ErrBudgetExhausted) || errors.Is(g.Reason, ErrKeyRequired))
}

// finish turns the engine's result into Do's. The engine returns a bare
// context error when a wait is cancelled; the caller gets it joined to
// the last attempt's outcome instead.
func (a *operation) finish(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	err = a.redact(err)
	if resp != nil {
		drain(resp.Body)
	}
	if a.waiting && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, a.stopped(err)
	}
	return nil, err
}

// notifyRetry tells the hook and the logger about a retry.
func (c *Client) notifyRetry(ctx context.Context, a *operation, reason idemtrace.RetryReason) {
	logger, hook := c.cfg.logger, c.cfg.hooks.OnRetry
	if logger == nil && hook == nil {
		return
	}
	ev := idemtrace.RetryEvent{
		Method:    a.req.Method,
		URL:       contract.RedactURL(a.req.URL, a.p.redactQuery, a.p.redactPath),
		Key:       a.key,
		Operation: a.operation,
		Attempt:   a.attempts + 1,
		Delay:     a.delay,
		Reason:    reason,
		Status:    a.lastStatus,
		Err:       a.lastErr,
	}
	if hook != nil {
		hook(a.hookCtx(), ev)
	}
	if logger != nil {
		attrs := []slog.Attr{
			slog.String("method", ev.Method),
			slog.String("url", ev.URL),
			slog.Int("attempt", ev.Attempt),
			slog.Duration("delay", ev.Delay),
			slog.String("reason", string(ev.Reason)),
		}
		if ev.Key != "" {
			attrs = append(attrs, contract.LogKey(ev.Key, a.c.cfg.logKeys))
		}
		if ev.Status != 0 {
			attrs = append(attrs, slog.Int("status", ev.Status))
		}
		if ev.Err != nil {
			attrs = append(attrs, c.errAttr(ev.Err, ev.Key))
		}
		logger.LogAttrs(ctx, slog.LevelInfo, "idemhttp: retrying", attrs...)
	}
}

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3):
// delta-seconds or an HTTP-date in any of its three forms. ok is false for
// a missing, negative or malformed value, which the caller ignores in favour
// of its own backoff. A number too large for a Duration saturates instead of
// overflowing, so it reads as "too long" rather than as a negative wait. A
// date in the past means no wait.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		for i := 0; i < len(v); i++ {
			if v[i] < '0' || v[i] > '9' {
				return 0, false
			}
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > uint64(math.MaxInt64/int64(time.Second)) {
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now) // saturates at the Duration bounds
	if d < 0 {
		d = 0
	}
	return d, true
}

// peekBody returns up to peekLen bytes of resp's body and puts them back in
// front of the rest, so the caller still reads the whole body.
func peekBody(resp *http.Response) []byte {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, peekLen))
	putBack(resp, buf, err)
	return buf
}

// putBack puts buf read from resp's body, and the error that stopped the read, back in front of it.
func putBack(resp *http.Response, buf []byte, err error) {
	resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), &errReader{err: err, r: resp.Body}), closer: resp.Body}
}

// prefixedBody is a body whose first bytes were peeked.
type prefixedBody struct {
	io.Reader
	closer io.Closer
}

func (b *prefixedBody) Close() error { return b.closer.Close() }

// errReader replays the error that interrupted a peek, then reads on.
type errReader struct {
	err error
	r   io.Reader
}

func (e *errReader) Read(p []byte) (int, error) {
	if e.err != nil {
		err := e.err
		e.err = nil
		return 0, err
	}
	return e.r.Read(p)
}

// errorHeader returns the headers of the last response that a
// GiveUpError carries: no credential, every URL redacted
// (contract.ErrorHeader).
func (a *operation) errorHeader(h http.Header) http.Header {
	return contract.ErrorHeader(h, a.cfg.secrets, a.p.redactQuery, a.p.redactPath)
}

// errorBody reads the last response's body, at most errorBodyLen bytes,
// for a GiveUpError, and reports whether it holds less than the whole
// body. Through StandardClient the response may go back to the SDK: its
// body is peeked and stays whole.
func (a *operation) errorBody(resp *http.Response) ([]byte, bool) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil, false
	}
	if a.sdk {
		buf, err := io.ReadAll(io.LimitReader(resp.Body, errorBodyLen+1))
		putBack(resp, buf, err)
		return errorBodyOf(bytes.Clone(buf), err)
	}
	return readErrorBody(nil, resp.Body, resp.ContentLength, false)
}

// readErrorBody reads into dst (its capacity reused) the first
// errorBodyLen bytes of a body about to be discarded, and with drain
// what follows them as drainWithin would, all within one drainTimeout
// (see readWithin), and reports whether they are not the whole body.
// size is the body's declared length, -1 if unknown: with it, one
// allocation of the right size holds the body. The body is left to be
// closed (and, without drain, drained).
func readErrorBody(dst []byte, body io.ReadCloser, size int64, drain bool) ([]byte, bool) {
	dst = dst[:0]
	if body == nil || body == http.NoBody {
		return dst, false
	}
	want := errorBodyLen + 1 // one more byte tells a longer body
	if size >= 0 && size < errorBodyLen {
		want = int(size) + 1 // and, here, the end
	}
	if cap(dst) < want && size >= 0 {
		dst = make([]byte, 0, want)
	}
	var err error
	readWithin(body, func(r io.Reader) {
		for len(dst) <= errorBodyLen {
			if len(dst) == cap(dst) {
				dst = slices.Grow(dst, min(max(2*cap(dst), 512), errorBodyLen+1)-len(dst))
			}
			var n int
			n, err = r.Read(dst[len(dst):min(cap(dst), errorBodyLen+1)])
			dst = dst[:len(dst)+n]
			if err != nil {
				return
			}
		}
		if drain {
			_, _ = io.Copy(io.Discard, io.LimitReader(r, drainLimit))
		}
	})
	if err == io.EOF {
		err = nil
	}
	return errorBodyOf(dst, err)
}

// errorBodyOf bounds a body read for an error to errorBodyLen bytes; the
// body was cut when it was longer or its reading failed. An empty body
// is nil.
func errorBodyOf(b []byte, err error) ([]byte, bool) {
	cut := err != nil
	if len(b) > errorBodyLen {
		b, cut = b[:errorBodyLen], true
	}
	if len(b) == 0 {
		b = nil
	}
	return b, cut
}

// snippet reads the first bytes of resp's body for an error message.
// Through StandardClient the response may go back to the SDK: its body
// stays whole.
func (a *operation) snippet(resp *http.Response) []byte {
	if a.sdk {
		b := peekBody(resp)
		if len(b) > snippetLen {
			b = b[:snippetLen]
		}
		return bytes.Clone(b)
	}
	return snippet(resp)
}

// snippet reads the first bytes of resp's body for an error message.
func snippet(resp *http.Response) []byte {
	if resp.Body == nil {
		return nil
	}
	// The body is about to be discarded: a stall must not hold the call.
	var b []byte
	readWithin(resp.Body, func(r io.Reader) { b, _ = io.ReadAll(io.LimitReader(r, snippetLen)) })
	if len(b) == 0 {
		return nil
	}
	return b
}

// drainLimit and drainTimeout bound how much of a discarded body is read,
// and for how long, so its connection can be reused; a larger rest, or a
// body that stalls, is cheaper to abandon with the connection than to wait
// for: a stall costs the connection, never the retry.
const (
	drainLimit   = 64 << 10
	drainTimeout = 100 * time.Millisecond
)

// drain reads what is left of a discarded body, boundedly in bytes and
// time, and closes it.
func drain(body io.ReadCloser) {
	if body == nil {
		return
	}
	drainWithin(body)
	_ = body.Close()
}

// drainWithin reads what is left of a discarded body, at most drainLimit
// bytes for at most drainTimeout. A body still unread then is closed,
// which aborts its connection and ends the read.
func drainWithin(body io.ReadCloser) {
	if body == nil || body == http.NoBody {
		return
	}
	readWithin(body, func(r io.Reader) { _, _ = io.Copy(io.Discard, io.LimitReader(r, drainLimit)) })
}

// readWithin runs read on a body about to be discarded and closes the body
// if read takes longer than drainTimeout, which aborts its connection and
// ends the read with an error instead of holding the call.
func readWithin(body io.ReadCloser, read func(io.Reader)) {
	t := time.AfterFunc(drainTimeout, func() { _ = body.Close() })
	defer t.Stop()
	read(body)
}
