package idemhttp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// Client sends HTTP requests so that retrying them is safe: a request that
// needs one gets an idempotency key before its first attempt, and every
// attempt carries that key and a byte-identical body. Failures the wire
// contract marks as retryable are retried with backoff, within the
// context's deadline and the client's retry budget; final failures come
// back as typed errors.
//
// The zero value is ready to use. A Client is safe for concurrent use by
// multiple goroutines and, like [http.Client], should be created once and
// reused: its retry budget and in-memory operation keys live in it. Set the
// fields before the first request; changes after that are not seen.
type Client struct {
	// HTTPClient sends each attempt; its Timeout bounds a single attempt,
	// reading its response body included.
	// nil means a client sharing one pooled Transport with 10 s dial and
	// TLS handshake timeouts and a 60 s response-header timeout. The
	// Client never closes HTTPClient's idle connections.
	HTTPClient *http.Client

	// Policy decides what is retried and how. nil means [DefaultPolicy].
	Policy *Policy

	// Journal, when set, records every keyed request durably before its
	// first attempt and its outcome after, so that a process that dies
	// mid-request can [Client.Resume] with the same key. nil keeps keys in
	// memory only: operations named with [WithOperation] reuse their key
	// for the life of the Client.
	Journal Journal

	// Logger receives one Info record per retry (method, redacted URL,
	// key, attempt, delay, reason). Bodies and header values are never
	// logged. nil means silent.
	Logger *slog.Logger

	// OnRetry, when set, is called before each retry's wait, on the
	// calling goroutine. It must not block.
	OnRetry func(RetryEvent)

	// PrepareRequest, when set, is called on every outgoing request after
	// its journal entry is written and before the first attempt, in Do and
	// in Resume. Add credentials here: whatever it sets never reaches the
	// journal. An error stops the call before anything is sent.
	PrepareRequest func(*http.Request) error

	// SecretHeaders names request headers, beyond Authorization, Cookie
	// and Proxy-Authorization, that are never written to the journal.
	SecretHeaders []string

	once   sync.Once
	pol    policy
	hc     *http.Client
	budget *budget
	mem    *memJournal
}

// init resolves the configuration once.
func (c *Client) init() {
	c.once.Do(func() {
		c.pol = c.Policy.resolve()
		var b Budget
		if c.Policy != nil {
			b = c.Policy.Budget
		}
		c.budget = newBudget(b)
		base := c.HTTPClient
		if base == nil {
			base = &http.Client{Transport: defaultTransport()}
		}
		rt := base.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		// The engine's client has no Timeout: net/http enforces one on a
		// RoundTripper it does not know (ours) with a goroutine and a
		// timer per request. attemptTransport applies it instead.
		c.hc = &http.Client{
			Transport:     attemptTransport{rt: rt, timeout: base.Timeout},
			CheckRedirect: base.CheckRedirect,
			Jar:           base.Jar,
		}
		c.mem = newMemJournal(c.pol.retention)
	})
}

// defaultTransport is shared by every Client without an HTTPClient, so
// that zero-value Clients share one connection pool, as http.DefaultClient
// users do.
var defaultTransport = sync.OnceValue(func() http.RoundTripper {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
})

// attemptTransport sends one attempt through the caller's RoundTripper.
//
// It hides that RoundTripper's CloseIdleConnections from the retry engine,
// which calls it on every failure: a caller's shared connection pool is not
// ours to drain. And it bounds the attempt by the caller's
// http.Client.Timeout, from sending until the response body is closed, as
// http.Client does; the error then satisfies errors.Is(err,
// context.DeadlineExceeded) and net.Error's Timeout, as http.Client's does.
// Each redirect hop gets the full timeout.
type attemptTransport struct {
	rt      http.RoundTripper
	timeout time.Duration
}

func (t attemptTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if t.timeout <= 0 {
		return t.rt.RoundTrip(r)
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.timeout)
	resp, err := t.rt.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelBody ends an attempt's timeout when its body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// Do sends req and returns its response, retrying as the [Policy] allows.
//
// Before the first attempt Do decides whether req needs a key (a method in
// Policy.KeyMethods, a key in the header or from [WithKey], or an
// operation from [WithOperation]), chooses it (the caller's, the journal's
// for the operation, or [NewKey]), makes the body replayable and, with a
// Journal, records the pending entry durably. req itself is not modified;
// its Body is closed, as net/http does.
//
// As with [http.Client.Do], a non-2xx response that is not retried (or
// whose retries are over and that the contract returns as is, such as a
// 404 or a replayed failure) comes back as a response with a nil error,
// and the caller must close its Body. Every other outcome comes back as an
// error with a nil response, never both:
//   - before sending: errors wrapping [ErrInvalidRequest], [ErrInvalidKey],
//     [ErrKeyConflict], [ErrNotReplayable], [ErrKeyExpired], or a local
//     [*KeyMismatchError];
//   - from the server: [*KeyMismatchError], or a [*GiveUpError] whose
//     reason is [ErrExhausted], [ErrInProgress], [ErrBudgetExhausted],
//     [ErrRetryAfterTooLong], [ErrKeyRequired] or the context's error;
//   - a transport error that must not be retried (an outcome-unknown
//     failure of a request without a key and with a non-idempotent method,
//     or a certificate error), untouched, as net/http returned it.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, fmt.Errorf("idemhttp: %w: nil request", ErrInvalidRequest)
	}
	if req.URL == nil {
		closeBody(req)
		return nil, fmt.Errorf("idemhttp: %w: nil URL", ErrInvalidRequest)
	}
	c.init()
	p := &c.pol
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err // nothing sent, nothing journaled
	}

	key, err := c.callerKey(ctx, req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	op, hasOp := operationFromContext(ctx)
	if hasOp {
		if err := validateOperation(op); err != nil {
			closeBody(req)
			return nil, err
		}
	}
	keyed := key != "" || hasOp || p.needsKey(req.Method)

	var j Journal
	if keyed {
		j = c.Journal
		if j == nil && hasOp {
			j = c.mem
		}
	}
	body, getBody, err := replayableBody(req, j != nil, p.maxBody)
	if err != nil {
		return nil, err
	}

	var entry *Entry
	if j != nil {
		entry, err = c.begin(ctx, j, req, key, op, body)
		if err != nil {
			return nil, err
		}
		key = entry.Key
	} else if keyed && key == "" {
		key = NewKey()
	}

	a := &attempt{c: c, p: p, key: key, operation: op, keyed: keyed, safe: keyed || idempotentMethod(req.Method)}
	out := req.WithContext(context.WithValue(ctx, callCtxKey, a))
	a.req = out
	if c.PrepareRequest != nil {
		out.Header = req.Header.Clone()
	}
	if keyed {
		if hv := FormatKeyHeader(key, p.quoteKey); headerValue(req.Header, p.keyHeader) != hv {
			if c.PrepareRequest == nil {
				out.Header = withHeader(req.Header, p.keyHeader, hv)
			} else {
				out.Header.Set(p.keyHeader, hv)
			}
		}
	}
	if c.PrepareRequest != nil {
		if out.Header == nil {
			out.Header = make(http.Header)
		}
		if err := c.PrepareRequest(out); err != nil {
			if getBody != nil {
				closeBody(req)
			}
			c.record(ctx, j, entry, StatePending, 0, 0)
			return nil, fmt.Errorf("idemhttp: prepare request: %w", err)
		}
	}

	// The engine's request lives in the call state: FromRequest would only
	// allocate it, since the body is set below.
	out.Body = nil
	rreq := &a.rreq
	rreq.Request = out
	switch {
	case body != nil:
		err = rreq.SetBody(body)
	case getBody != nil:
		a.firstBody, a.getBody = req.Body, getBody
		a.probing = true // SetBody reads the body once to measure it
		err = rreq.SetBody(retryablehttp.ReaderFunc(a.body))
		a.probing = false
		rreq.ContentLength = req.ContentLength
	}
	if err != nil {
		if getBody != nil {
			closeBody(req)
		}
		c.record(ctx, j, entry, StatePending, 0, 0)
		return nil, fmt.Errorf("idemhttp: %w: body: %w", ErrNotReplayable, err)
	}

	a.engine = retryablehttp.Client{
		HTTPClient:   c.hc,
		RetryMax:     p.maxAttempts, // checkRetry stops first; this is a backstop
		CheckRetry:   engineCheckRetry,
		Backoff:      engineBackoff,
		PrepareRetry: enginePrepareRetry,
		ErrorHandler: engineErrorHandler,
	}
	resp, err := a.finish(a.engine.Do(rreq))
	if a.firstBody != nil {
		_ = a.firstBody.Close() // never sent; net/http would have closed it
	}
	if entry != nil {
		c.record(ctx, j, entry, outcomeState(err), a.lastStatus, a.attempts)
	}
	return resp, err
}

// callerKey returns the key the caller chose, from the header or WithKey,
// or "" if none.
func (c *Client) callerKey(ctx context.Context, req *http.Request) (string, error) {
	var key string
	if v := headerValue(req.Header, c.pol.keyHeader); v != "" {
		k, err := ParseKeyHeader(v)
		if err != nil {
			return "", err
		}
		key = k
	}
	if k, ok := keyFromContext(ctx); ok {
		if err := ValidateKey(k); err != nil {
			return "", err
		}
		if key != "" && key != k {
			return "", fmt.Errorf("idemhttp: %w: header has %q, WithKey has %q", ErrKeyConflict, key, k)
		}
		key = k
	}
	return key, nil
}

// replayableBody makes req's body resendable: GetBody when the request has
// one (and no journal needs the bytes), else the body read into memory,
// up to maxBody, and closed. With GetBody, req.Body stays open: the first
// attempt sends it, as net/http would.
func replayableBody(req *http.Request, needBytes bool, maxBody int64) ([]byte, func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil, nil
	}
	if req.GetBody != nil && !needBytes {
		return nil, req.GetBody, nil
	}
	defer closeBody(req)
	// Sized from Content-Length (+1 so reaching EOF needs no growth):
	// bytes.Buffer.ReadFrom would double a 1 KiB buffer to keep 512 bytes
	// free, for every journaled request.
	size := 512
	if req.ContentLength > 0 && req.ContentLength <= maxBody {
		size = int(req.ContentLength) + 1
	}
	buf := make([]byte, 0, size)
	r := io.LimitReader(req.Body, maxBody+1)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("idemhttp: %w: read body: %w", ErrInvalidRequest, err)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
	if int64(len(buf)) > maxBody {
		return nil, nil, fmt.Errorf("idemhttp: %w: body larger than MaxBodyBytes (%d)", ErrNotReplayable, maxBody)
	}
	if len(buf) == 0 {
		return nil, nil, nil
	}
	return buf, nil, nil
}

// headerValue is h.Get(name) for a name already in canonical form (the
// policy canonicalises KeyHeader once), without canonicalising it again on
// every request.
func headerValue(h http.Header, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// withHeader returns a copy of h with name set to v. The copy shares h's
// value slices, which nothing downstream mutates; copying them too would
// cost an allocation per request for nothing.
func withHeader(h http.Header, name, v string) http.Header {
	out := make(http.Header, len(h)+1)
	for k, vv := range h {
		out[k] = vv
	}
	out[name] = []string{v}
	return out
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// outcomeState maps a call's result to its journal state: a response or
// a refusal that no retry would change is done; a give-up or a transport
// error leaves the operation pending, for Resume.
func outcomeState(err error) State {
	if err == nil || errors.Is(err, ErrKeyMismatch) || errors.Is(err, ErrKeyRequired) {
		return StateDone
	}
	return StatePending
}

// begin records the pending entry for a keyed call before anything is
// sent, or finds the entry a previous run left for the same operation.
func (c *Client) begin(ctx context.Context, j Journal, req *http.Request, key, op string, body []byte) (*Entry, error) {
	u := *req.URL
	u.User = nil
	url := u.String()
	fp := Fingerprint(req.Method, url, body)
	candidate := key
	if candidate == "" {
		candidate = NewKey()
	}
	h := req.Header.Clone()
	dropSecrets(h, c.pol.keyHeader, c.SecretHeaders)
	now := time.Now()
	e := &Entry{
		Operation:   op,
		Key:         candidate,
		Method:      req.Method,
		URL:         url,
		Header:      h,
		Body:        body,
		Fingerprint: fp,
		Created:     now,
		Updated:     now,
		State:       StatePending,
	}
	existing, err := j.Begin(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal: %w", err)
	}
	if existing == nil {
		return e, nil
	}
	if key != "" && existing.Key != key {
		return nil, fmt.Errorf("idemhttp: %w: operation %q has key %s in the journal, request has %s", ErrKeyConflict, op, existing.Key, key)
	}
	if existing.Fingerprint != fp {
		return nil, &KeyMismatchError{Key: existing.Key, Operation: existing.Operation}
	}
	if existing.State != StateDone && latest(existing.Created, existing.Updated).After(now.Add(ClockTolerance)) {
		return nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", existing.Operation, existing.Key, existing.Created.Format(time.RFC3339), ErrClockJump)
	}
	if existing.State == StateAbandoned || now.Sub(existing.Created) > c.pol.retention {
		return nil, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", existing.Operation, existing.Key, existing.Created.Format(time.RFC3339), ErrKeyExpired)
	}
	return existing, nil
}

// record writes a call's outcome to its journal entry. A failure here
// cannot change the call's result (the request already went out), and
// leaves the entry pending, which Resume resolves by resending with the
// same key; so it is logged, not returned.
func (c *Client) record(ctx context.Context, j Journal, e *Entry, s State, status, attempts int) {
	if e == nil {
		return
	}
	err := j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: s, Status: status, Attempts: attempts, At: time.Now()})
	if err != nil && c.Logger != nil {
		c.Logger.LogAttrs(ctx, slog.LevelWarn, "idemhttp: journal finish failed; entry stays pending",
			slog.String("key", e.Key), slog.String("state", string(s)), slog.String("error", err.Error()))
	}
}

// Fingerprint returns the hex SHA-256 of a request's method, URL and body:
// what a journal compares to refuse the same operation with another body.
func Fingerprint(method, url string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(url))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// StandardClient returns an [http.Client] that sends every request
// through c, so any SDK that accepts an *http.Client gets keys and safe
// retries. A key the SDK sets itself (stripe-go sets Idempotency-Key) is
// kept, not replaced. Errors reach the SDK wrapped in [*url.Error]; errors.Is
// and errors.As still see the typed errors of [Client.Do]. Its
// CloseIdleConnections does nothing: the pool belongs to c.HTTPClient.
func (c *Client) StandardClient() *http.Client {
	return &http.Client{Transport: c.Transport()}
}

// Transport returns an [http.RoundTripper] that sends every request
// through c. See [Client.StandardClient].
func (c *Client) Transport() http.RoundTripper {
	return roundTripper{c}
}

type roundTripper struct{ c *Client }

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return t.c.Do(req) }
