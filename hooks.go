package idemhttp

import (
	"context"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"

	"github.com/hashicorp/go-retryablehttp"
)

// hooksSet reports whether any hook of h is set.
func hooksSet(h *idemtrace.Hooks) bool {
	return h != nil && (h.OnCallStart != nil || h.OnAttempt != nil || h.OnAttemptDone != nil ||
		h.OnRetry != nil || h.OnBudgetRefused != nil || h.OnGiveUp != nil || h.OnCallDone != nil || h.OnJournal != nil)
}

// call returns the event identity of a.
func (a *operation) call() idemtrace.CallEvent {
	if a.redURL == "" {
		a.redURL = contract.RedactURL(a.req.URL, a.p.redactQuery, a.p.redactPath)
	}
	return idemtrace.CallEvent{Method: a.req.Method, URL: a.redURL, Key: a.key, Operation: a.operation}
}

// hookCtx is the context hooks get: the call's.
func (a *operation) hookCtx() context.Context { return &a.cctx }

// engineRequestHook is the engine's RequestLogHook, installed only on calls
// with attempt hooks or a Pacer: it paces the attempt, times it and
// reports its start.
func engineRequestHook(_ retryablehttp.Logger, r *http.Request, _ int) {
	a := attemptFrom(r.Context())
	if a == nil {
		return
	}
	a.paceErr = nil
	if pc := a.p.pacer; pc != nil {
		// A refusal (Wait's error: the context ended, or the Pacer would
		// not let the attempt go before the deadline) stops the attempt
		// before it is handed to the transport (handOver), and checkRetry
		// stops the call with it: a Pacer is never bypassed.
		if err := pc.Wait(r.Context()); err != nil {
			a.paceErr = err
			return
		}
	}
	a.attemptStart = time.Now()
	if h := &a.cfg.hooks; h.OnAttempt != nil {
		h.OnAttempt(a.hookCtx(), idemtrace.AttemptEvent{CallEvent: a.call(), Attempt: a.attempts + 1})
	}
}

// attemptDone reports an attempt's outcome.
func (a *operation) attemptDone(resp *http.Response, err error, class idemtrace.ErrorClass) {
	if a.cfg.hooks.OnAttemptDone != nil {
		a.attemptDoneHook(resp, err, class)
	}
}

// attemptDoneHook is attemptDone for a Client with OnAttemptDone.
//
//go:noinline
func (a *operation) attemptDoneHook(resp *http.Response, err error, class idemtrace.ErrorClass) {
	h := &a.cfg.hooks
	ev := idemtrace.AttemptDoneEvent{CallEvent: a.call(), Attempt: a.attempts, Err: err, Class: class}
	if !a.attemptStart.IsZero() {
		ev.Latency = time.Since(a.attemptStart)
	}
	if err == nil && resp != nil {
		ev.Status, ev.Response = resp.StatusCode, resp
	}
	h.OnAttemptDone(a.hookCtx(), ev)
}

// callStart reports the call's start and returns the call's context.
func (a *operation) callStart(ctx context.Context) context.Context {
	if h := &a.cfg.hooks; h.OnCallStart == nil && h.OnCallDone == nil {
		return ctx
	}
	return a.callStartHook(ctx)
}

// callStartHook is callStart for a Client with OnCallStart or OnCallDone.
//
//go:noinline
func (a *operation) callStartHook(ctx context.Context) context.Context {
	h := &a.cfg.hooks
	a.callStarted = time.Now()
	if h.OnCallStart != nil {
		if nc := h.OnCallStart(ctx, a.call()); nc != nil {
			ctx = nc
		}
	}
	return ctx
}

// end reports the call's result and returns it unchanged.
func (a *operation) end(resp *http.Response, err error) (*http.Response, error) {
	if a.cfg.hooks.OnCallDone != nil {
		a.endHook(resp, err)
	}
	a.returned = true
	return resp, err
}

// endHook is end's report for a Client with OnCallDone.
//
//go:noinline
func (a *operation) endHook(resp *http.Response, err error) {
	h := &a.cfg.hooks
	ev := idemtrace.CallDoneEvent{CallEvent: a.call(), Attempts: a.attempts, Status: a.lastStatus, Err: err, Duration: time.Since(a.callStarted)}
	if resp != nil {
		ev.Status, ev.Replayed = resp.StatusCode, Replayed(resp)
	}
	h.OnCallDone(a.hookCtx(), ev)
}

// journalEvent reports a journal operation.
func (c *Client) journalEvent(ctx context.Context, ev idemtrace.JournalEvent, start time.Time) {
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
