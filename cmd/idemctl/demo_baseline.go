package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/idemtrace"
)

// demoTwoRuns is the baselines' batch job: a first run starts the
// charges up to the crash, the last of them dying in flight; the rerun
// resends every charge the first did not see succeed, as a job that
// records completions (say, in its database) would. Without a journal it
// has no better way to know what the server did.
func demoTwoRuns(ctx context.Context, o *demoOptions, ops []demoOp, st *demoStats, send func(context.Context, demoOp) bool) {
	send = st.track(send)
	first := ops
	if n := o.crashAt(); n > 0 {
		first = ops[:n]
	}
	ok := pool(ctx, first, o.concurrency, send)
	var rest []demoOp
	for i, op := range ops {
		if i >= len(first) || !ok[i] {
			op.dies = survives
			rest = append(rest, op)
		}
	}
	st.rerun = len(rest)
	for _, good := range pool(ctx, rest, o.concurrency, send) {
		if !good {
			st.failed++
		}
	}
}

// demoPlain sends each charge once per run with net/http, as most code
// does: no key, no retry.
func demoPlain(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	tr, cnt := newDemoTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: crashTransport{cnt}, Timeout: o.timeout}
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

// keying says which Idempotency-Key a go-retryablehttp column sends.
type keying int

const (
	noKey      keying = iota // as most of its users send
	mintedKey                // a random key per call, kept across its retries
	derivedKey               // HMAC-SHA256(secret, order id): the same on a rerun
)

// demoRetryable sends each charge with go-retryablehttp: its default retry
// policy (connection errors, 429 and 5xx; at most 4 retries) and backoff
// (which honours Retry-After on 429 and 503), with the demo's short timeout
// and tiny waits instead of its 1-30 s, and no key, as most of its users
// send.
func demoRetryable(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	return demoRetryableWith(ctx, o, ops, srv, st, noKey)
}

// demoRetryableMinted is demoRetryable with an Idempotency-Key minted per
// call: its retries resend the key, so they are safe, but the rerun after
// the crash has no journal to find the first run's keys in and mints new
// ones.
func demoRetryableMinted(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	return demoRetryableWith(ctx, o, ops, srv, st, mintedKey)
}

// demoRetryableDerived is what a careful user writes by hand: the key is
// HMAC-SHA256 of the order id under a secret, so the rerun sends the same
// key without a journal, and the server replays what the first run did.
// What it cannot do (a server that forgot the key, a changed body, a
// record of what is pending) is in the README.
func demoRetryableDerived(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	return demoRetryableWith(ctx, o, ops, srv, st, derivedKey)
}

func demoRetryableWith(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats, k keying) error {
	tr, cnt := newDemoTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: crashTransport{cnt}, Timeout: o.timeout}
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
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // never fails (crypto/rand)
	demoTwoRuns(ctx, o, ops, st, func(ctx context.Context, op demoOp) bool {
		ctx = context.WithValue(ctx, retryReasonKey{}, new(idemtrace.RetryReason))
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", op.body)
		if err != nil {
			return false
		}
		req.Header.Set("Content-Type", "application/json")
		switch k {
		case mintedKey:
			req.Header.Set("Idempotency-Key", idemhttp.NewKey())
		case derivedKey:
			req.Header.Set("Idempotency-Key", handDerivedKey(secret, op.id))
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

// handDerivedKey is a key as a careful user derives it by hand: the hex
// HMAC-SHA256 of the order id under a secret kept with the job, the same
// on every run.
func handDerivedKey(secret []byte, orderID string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(orderID))
	return hex.EncodeToString(m.Sum(nil))
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
