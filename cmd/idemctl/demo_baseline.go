package main

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/idemtrace"
)

// demoTwoRuns is the baselines' batch job: a first run crashes half way;
// the rerun resends every charge the first did not see succeed, as a job
// that records completions (say, in its database) would. Without a key
// the rerun has no other way to know what the server did.
func demoTwoRuns(ctx context.Context, o *demoOptions, ops []demoOp, st *demoStats, send func(context.Context, demoOp) bool) {
	send = st.track(send)
	ok := pool(ctx, ops, o.concurrency, o.crashAt(), func() {}, send)
	var rest []demoOp
	for i, op := range ops {
		if !ok[i] {
			rest = append(rest, op)
		}
	}
	for _, good := range pool(ctx, rest, o.concurrency, 0, nil, send) {
		if !good {
			st.failed++
		}
	}
}

// demoPlain sends each charge once per run with net/http, as most code
// does: no key, no retry.
func demoPlain(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	tr := newTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	cnt := &counter{rt: tr}
	hc := &http.Client{Transport: cnt, Timeout: o.timeout}
	demoTwoRuns(ctx, o, ops, st, func(ctx context.Context, op demoOp) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(op.body))
		if err != nil {
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		drainClose(resp)
		return resp.StatusCode < 300
	})
	st.attempts = cnt.attempts.Load()
	return nil
}

// retryReasonKey carries, in a request's context, the reason the
// retryablehttp client is about to retry it, from CheckRetry to
// PrepareRetry, which runs only when a retry really happens.
type retryReasonKey struct{}

// demoRetryable sends each charge with go-retryablehttp: its default retry
// policy (connection errors, 429 and 5xx; at most 4 retries) and backoff
// (which honours Retry-After on 429 and 503), with the demo's short timeout
// and tiny waits instead of its 1-30 s, and no key, as most of its users
// send.
func demoRetryable(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	return demoRetryableWith(ctx, o, ops, srv, st, false)
}

// demoRetryableKeyed is demoRetryable with an Idempotency-Key, minted per
// call as careful users of it do: its retries resend the key, so they are
// safe, but the rerun after the crash has no journal to find the first
// run's keys in and mints new ones, and a 409 (the first attempt still in
// progress) is not retried. The column shows what the journal and resume
// add beyond sending a key.
func demoRetryableKeyed(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	return demoRetryableWith(ctx, o, ops, srv, st, true)
}

func demoRetryableWith(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats, keyed bool) error {
	tr := newTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	cnt := &counter{rt: tr}
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: cnt, Timeout: o.timeout}
	rc.Logger = nil // its default logs every attempt to stderr
	rc.RetryWaitMin = time.Millisecond
	rc.RetryWaitMax = 10 * time.Millisecond
	rc.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		retry, cerr := retryablehttp.DefaultRetryPolicy(ctx, resp, err)
		if retry {
			*ctx.Value(retryReasonKey{}).(*idemtrace.RetryReason) = baselineReason(resp, err)
		}
		return retry, cerr
	}
	rc.PrepareRetry = func(r *http.Request) error {
		st.retry(*r.Context().Value(retryReasonKey{}).(*idemtrace.RetryReason))
		return nil
	}
	demoTwoRuns(ctx, o, ops, st, func(ctx context.Context, op demoOp) bool {
		ctx = context.WithValue(ctx, retryReasonKey{}, new(idemtrace.RetryReason))
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", op.body)
		if err != nil {
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		if keyed {
			req.Header.Set("Idempotency-Key", idemhttp.NewKey())
		}
		resp, err := rc.Do(req)
		if err != nil {
			return false
		}
		drainClose(resp)
		return resp.StatusCode < 300
	})
	st.attempts = cnt.attempts.Load()
	return nil
}

// baselineReason names a retryablehttp retry with idemhttp's reasons, so
// the table compares like with like.
func baselineReason(resp *http.Response, err error) idemtrace.RetryReason {
	switch {
	case err != nil && neverConnected(err):
		return idemtrace.ReasonNotSent
	case err != nil || resp == nil:
		return idemtrace.ReasonUnknownOutcome
	case resp.StatusCode == http.StatusTooManyRequests:
		return idemtrace.ReasonRateLimited
	case resp.StatusCode == http.StatusServiceUnavailable:
		return idemtrace.ReasonUnavailable
	}
	return idemtrace.ReasonServerError
}
