package idemhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-retryablehttp"
)

// This file is the attempt loop. It runs on go-retryablehttp's engine
// (Client.Do: body rewind per attempt, bounded drain of discarded bodies,
// the timer and context select) with our own CheckRetry, Backoff,
// PrepareRetry and ErrorHandler. Three parts of the engine cannot express
// the contract, and are wrapped:
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
//     Transport hides CloseIdleConnections (see idleKeeper).

// peekLen bounds how much of a 400 body is read to recognise an
// idempotency error.
const peekLen = 4 << 10

// attempt is the state of one Do call across its attempts. It rides in
// the outgoing request's context, which is how the engine's hooks (plain
// functions, so a call allocates no closures) and ResponseInfo find it.
type attempt struct {
	c   *Client
	p   *policy
	req *http.Request // the outgoing request, for logging and events

	key       string // idempotency key sent, "" if none
	operation string // operation id, "" if none
	attempts  int    // attempts made so far

	keyed bool // carries a key: retries are safe whatever the method
	safe  bool // keyed or an idempotent method

	lastStatus int
	lastErr    error
	retryAfter time.Duration
	charged    int64 // budget tokens this call withdrew
	waiting    bool  // a retry was decided and its wait has not ended
	bo         *backoff.ExponentialBackOff

	// A body with GetBody: the first attempt sends the caller's Body, later
	// ones a fresh copy from GetBody, so a request that succeeds at once
	// costs no copies. probing is set while the engine measures the body.
	firstBody io.ReadCloser
	getBody   func() (io.ReadCloser, error)
	probing   bool

	engine retryablehttp.Client
	rreq   retryablehttp.Request
}

// body is the engine's ReaderFunc for a request with GetBody.
func (a *attempt) body() (io.Reader, error) {
	if a.probing {
		return http.NoBody, nil // Do sets ContentLength from the request
	}
	if b := a.firstBody; b != nil {
		a.firstBody = nil
		return b, nil
	}
	return a.getBody()
}

// attemptFrom returns the call state riding in ctx.
func attemptFrom(ctx context.Context) *attempt {
	a, _ := ctx.Value(callCtxKey).(*attempt)
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
		attemptFrom(r.Context()).waiting = false
		return nil
	}
)

// Info describes how a response was obtained. See [ResponseInfo].
type Info struct {
	Key       string // idempotency key sent, "" if none
	Operation string // operation id from WithOperation, "" if none
	Attempts  int    // attempts made, the first included; see below

	Replayed bool // the server replayed a stored response
}

// ResponseInfo reports the key, operation, attempt count and replay flag of
// a response returned by [Client.Do] (or by a [Client.StandardClient]). ok
// is false for a response that did not come through a Client.
//
// Attempts counts the attempts idemhttp made. Within one attempt,
// net/http's Transport may itself resend a request that carries an
// Idempotency-Key header once, when a reused pooled connection turns out
// to be dead; that resend is safe (same key, same body) and not counted.
func ResponseInfo(resp *http.Response) (info Info, ok bool) {
	if resp == nil || resp.Request == nil {
		return Info{}, false
	}
	a := attemptFrom(resp.Request.Context())
	if a == nil {
		return Info{}, false
	}
	return Info{Key: a.key, Operation: a.operation, Attempts: a.attempts, Replayed: Replayed(resp)}, true
}

// RetryEvent describes a retry about to happen. See [Client.OnRetry].
type RetryEvent struct {
	Method    string        // request method
	URL       string        // request URL, with any password redacted
	Key       string        // idempotency key, "" if none
	Operation string        // operation id, "" if none
	Attempt   int           // number of the attempt about to be made (2 for the first retry)
	Delay     time.Duration // wait before it
	Reason    RetryReason   // why the previous attempt is retried
	Status    int           // status of the previous attempt, 0 if it got no response
	Err       error         // error of the previous attempt, nil if it got a response
}

// checkRetry is the engine's CheckRetry: it classifies the attempt, decides
// whether to retry, and computes the wait.
func (a *attempt) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	a.attempts++
	a.waiting = false
	if err != nil {
		a.lastStatus, a.lastErr = 0, err
		if ctxErr := ctx.Err(); ctxErr != nil {
			return false, a.giveUp(ctxErr, nil)
		}
		switch classifyError(err) {
		case errPermanent:
			return false, nil // the engine hands err back untouched
		case errNotSent:
			return a.retry(ctx, ReasonNotSent, nil, false)
		default:
			if !a.safe {
				// A POST without a key may have run: resending could run it
				// twice. Hand the error back as net/http would.
				return false, nil
			}
			return a.retry(ctx, ReasonUnknownOutcome, nil, isTimeout(err))
		}
	}

	a.lastStatus, a.lastErr = resp.StatusCode, nil
	v, reason := a.p.classifyStatus(resp, a.keyed, a.safe, func() []byte { return peekBody(resp) })
	switch v {
	case vRetry:
		return a.retry(ctx, reason, resp, false)
	case vMismatch:
		return false, &KeyMismatchError{Key: a.key, StatusCode: resp.StatusCode, Body: snippet(resp)}
	case vKeyRequired:
		return false, a.giveUp(ErrKeyRequired, resp)
	}
	if resp.StatusCode < 300 {
		if a.charged > 0 {
			a.c.budget.deposit(a.charged)
		} else if a.attempts == 1 {
			a.c.budget.deposit(1)
		}
	}
	return false, nil
}

// retry decides whether the retry the policy asked for can happen: attempts
// left, a Retry-After within bounds, a wait that ends before the deadline,
// and budget to pay for it.
func (a *attempt) retry(ctx context.Context, reason RetryReason, resp *http.Response, timeout bool) (bool, error) {
	a.retryAfter = 0
	hinted := false
	if resp != nil {
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			a.retryAfter, hinted = d, true
		}
	}
	if a.attempts >= a.p.maxAttempts {
		sentinel := ErrExhausted
		if reason == ReasonInProgress {
			sentinel = ErrInProgress
		}
		return false, a.giveUp(sentinel, resp)
	}
	if hinted && a.retryAfter > a.p.maxRetryAfter {
		return false, a.giveUp(ErrRetryAfterTooLong, resp)
	}
	delay := a.retryAfter
	if !hinted {
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
		delay = a.bo.NextBackOff()
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= delay {
		// Sleeping would only end in the context's error: stop now, with
		// the last outcome, instead of holding the caller until then.
		if hinted {
			return false, a.giveUpJoin(ErrRetryAfterTooLong, context.DeadlineExceeded, resp)
		}
		return false, a.giveUp(context.DeadlineExceeded, resp)
	}
	if reason != ReasonInProgress {
		cost, ok := a.c.budget.withdraw(timeout)
		if !ok {
			return false, a.giveUp(ErrBudgetExhausted, resp)
		}
		a.charged += cost
	}
	if resp != nil {
		// The engine drains only 4 KiB before closing; a load balancer's
		// error page is often larger, and the connection is worth keeping.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
	}
	a.engine.RetryWaitMin = delay
	a.waiting = true
	a.c.notifyRetry(ctx, a, reason)
	return true, nil
}

// giveUp builds the final error of a call that stops retrying.
func (a *attempt) giveUp(reason error, resp *http.Response) *GiveUpError {
	return a.giveUpJoin(reason, nil, resp)
}

// giveUpJoin is giveUp with a second cause joined to the last attempt's
// error (the deadline that a Retry-After would have crossed).
func (a *attempt) giveUpJoin(reason, also error, resp *http.Response) *GiveUpError {
	e := &GiveUpError{
		Method:     a.req.Method,
		URL:        a.req.URL.Redacted(),
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
	if resp != nil {
		e.Body = snippet(resp)
	}
	return e
}

// engineErrorHandler is the engine's ErrorHandler: the engine stops here
// with the error checkRetry returned (or the untouched transport error).
// It closes the last response, so a response and an error never travel
// together.
func engineErrorHandler(resp *http.Response, err error, _ int) (*http.Response, error) {
	if resp != nil {
		drain(resp.Body)
	}
	return nil, err
}

// finish turns the engine's result into Do's. The engine returns a bare
// context error when a wait is cancelled; the caller gets it joined to
// the last attempt's outcome instead.
func (a *attempt) finish(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	if resp != nil {
		drain(resp.Body)
	}
	if a.waiting && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, a.giveUp(err, nil)
	}
	return nil, err
}

// notifyRetry tells the hook and the logger about a retry.
func (c *Client) notifyRetry(ctx context.Context, a *attempt, reason RetryReason) {
	if c.OnRetry == nil && c.Logger == nil {
		return
	}
	ev := RetryEvent{
		Method:    a.req.Method,
		URL:       a.req.URL.Redacted(),
		Key:       a.key,
		Operation: a.operation,
		Attempt:   a.attempts + 1,
		Delay:     a.engine.RetryWaitMin,
		Reason:    reason,
		Status:    a.lastStatus,
		Err:       a.lastErr,
	}
	if c.OnRetry != nil {
		c.OnRetry(ev)
	}
	if c.Logger != nil {
		attrs := []slog.Attr{
			slog.String("method", ev.Method),
			slog.String("url", ev.URL),
			slog.Int("attempt", ev.Attempt),
			slog.Duration("delay", ev.Delay),
			slog.String("reason", string(ev.Reason)),
		}
		if ev.Key != "" {
			attrs = append(attrs, slog.String("key", ev.Key))
		}
		if ev.Status != 0 {
			attrs = append(attrs, slog.Int("status", ev.Status))
		}
		if ev.Err != nil {
			attrs = append(attrs, slog.String("error", ev.Err.Error()))
		}
		c.Logger.LogAttrs(ctx, slog.LevelInfo, "idemhttp: retrying", attrs...)
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
	resp.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), &errReader{err: err, r: resp.Body}), closer: resp.Body}
	return buf
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

// snippet reads the first bytes of resp's body for an error message.
func snippet(resp *http.Response) []byte {
	if resp.Body == nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, snippetLen))
	if len(b) == 0 {
		return nil
	}
	return b
}

// drainLimit bounds how much of a discarded body is read so its connection
// can be reused; a larger rest is cheaper to abandon with the connection.
const drainLimit = 64 << 10

// drain reads what is left of a discarded body, boundedly, and closes it.
func drain(body io.ReadCloser) {
	if body == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainLimit))
	_ = body.Close()
}

// isStripeIdempotencyError recognises Stripe's refusal of a reused key:
// 400 with {"error": {"type": "idempotency_error"}}.
func isStripeIdempotencyError(b []byte) bool {
	if !bytes.Contains(b, []byte("idempotency_error")) {
		return false
	}
	var v struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &v) == nil && v.Error.Type == "idempotency_error"
}

// isKeyMissingProblem recognises the IETF draft's 400 for a missing key: a
// problem document whose type or title names the idempotency key.
func isKeyMissingProblem(b []byte) bool {
	var v struct {
		Type  string `json:"type"`
		Title string `json:"title"`
	}
	if json.Unmarshal(b, &v) != nil {
		return false
	}
	return strings.Contains(strings.ToLower(v.Type+" "+v.Title), "idempotency")
}
