package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"

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
// reused: its retry budget and in-memory operation keys live in it. Every
// field, and the [Policy] it points to, is read once, at the first request
// (slices are copied): changes after that are not seen, and making them is
// not a data race.
type Client struct {
	// HTTPClient sends each attempt; its Timeout bounds a single attempt,
	// reading its response body included. Its CheckRedirect and Jar are
	// used, inside the redirect rules of [Client.Do].
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
	// for [Policy.Retention] within the life of the Client.
	Journal Journal

	// Logger receives one Info record per retry (method, redacted URL,
	// key, attempt, delay, reason). Bodies, header values and the values
	// of secret query parameters ([Policy.RedactQuery]) are never logged.
	// nil means silent.
	Logger *slog.Logger

	// Hooks, when set, are called at each decision of every call:
	// attempts, retries, give-ups, budget refusals, journal writes. See
	// [idemtrace.Hooks]. nil costs nothing.
	Hooks *idemtrace.Hooks

	// PrepareRequest, when set, is called on every outgoing request after
	// its journal entry is written and before the first attempt, in Do and
	// in Resume. Add credentials here: whatever it sets never reaches the
	// journal, and never follows a redirect to another host. It gets the
	// client's own copies of the request's URL and Header (never nil), so
	// it may change them freely; the caller's request is not modified. An
	// error (or a panic) stops the call before anything is sent, and the
	// journal keeps no entry that Resume would send.
	PrepareRequest func(*http.Request) error

	// SecretHeaders names request headers, beyond Authorization, Cookie
	// and Proxy-Authorization, that are never written to the journal
	// (matched in any letter case) and never follow a redirect to another
	// host.
	SecretHeaders []string

	// clock, when set (by tests only, before the first call), replaces
	// time.Now for the journal's times and the retention and clock
	// checks, so that tests can set the clock back.
	clock func() time.Time

	once sync.Once
	cfg  config
}

// config is a Client's configuration, read once by init: the request path
// never reads the exported fields, so a caller who changes them later
// neither races with it nor changes what it does.
type config struct {
	pol     policy
	hc      *http.Client
	budget  *budget
	mem     *memJournal
	journal Journal
	logger  *slog.Logger
	hooks   idemtrace.Hooks // a copy of *Client.Hooks; every field nil when unset
	prepare func(*http.Request) error
	secrets []string         // canonical names of the caller's secret headers
	now     func() time.Time // Client.clock, or time.Now
	// inflight counts the calls in Do, for Stats.
	inflight atomic.Int64
	// traceable: the Transport is net/http's, which reports httptrace
	// events, so an attempt that never obtained a connection failed
	// before anything could be sent (see attempt.wire).
	traceable bool
}

// init resolves the configuration once.
func (c *Client) init() {
	c.once.Do(func() {
		cfg := &c.cfg
		cfg.pol = c.Policy.resolve()
		var b Budget
		if c.Policy != nil {
			b = c.Policy.Budget
		}
		cfg.budget = newBudget(b)
		base := c.HTTPClient
		if base == nil {
			base = &http.Client{Transport: defaultTransport()}
		}
		rt := base.Transport
		if rt == nil {
			rt = http.DefaultTransport
		}
		_, cfg.traceable = rt.(*http.Transport)
		// The engine's client has no Timeout: net/http enforces one on a
		// RoundTripper it does not know (ours) with a goroutine and a
		// timer per request. attemptTransport applies it instead.
		cfg.hc = &http.Client{
			Transport:     attemptTransport{rt: rt, timeout: base.Timeout},
			CheckRedirect: checkRedirect(base.CheckRedirect),
			Jar:           base.Jar,
		}
		cfg.mem = newMemJournal(cfg.pol.retention)
		cfg.journal = c.Journal
		if r, ok := c.Journal.(retainer); ok {
			// Policy.Retention is the one retention setting: a journal that
			// prunes by itself must not drop a done entry the client would
			// still reuse the key of.
			r.Retain(cfg.pol.retention)
		}
		cfg.logger = c.Logger
		if hooksSet(c.Hooks) {
			cfg.hooks = *c.Hooks
		}
		cfg.prepare = c.PrepareRequest
		cfg.now = c.clock
		if cfg.now == nil {
			cfg.now = time.Now
		}
		for _, h := range c.SecretHeaders {
			cfg.secrets = append(cfg.secrets, http.CanonicalHeaderKey(h))
		}
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
// Journal, records the pending entry durably. The key header is found in
// any letter case; every attempt carries exactly one, in canonical form.
// req itself is not modified; its Body is closed, as net/http does.
//
// As with [http.Client.Do], a non-2xx response that is not retried (or
// whose retries are over and that the contract returns as is, such as a
// 404, an application's own 409 or 422, or a replayed failure) comes back
// as a response with a nil error, and the caller must close its Body. Every
// other outcome comes back as an error with a nil response, never both:
//   - before sending: errors wrapping [ErrInvalidRequest], [ErrInvalidKey],
//     [ErrKeyConflict], [ErrNotReplayable], [ErrKeyExpired], a local
//     [*KeyMismatchError], or a [*DoneError] for an operation the journal
//     has done (nothing is sent: done is done);
//   - from the server: [*KeyMismatchError], or a [*GiveUpError] whose
//     reason is [ErrExhausted], [ErrInProgress], [ErrBudgetExhausted],
//     [ErrRetryAfterTooLong], [ErrKeyRequired], [ErrBodyChanged],
//     [ErrNotReplayable] (GetBody failed on a retry) or the context's error;
//   - a transport error that must not be retried, untouched, as net/http
//     returned it: an outcome-unknown failure of a request without a key
//     and with a non-idempotent method, a certificate error, a request
//     net/http refused before connecting (an invalid header, an
//     unsupported scheme), or a CheckRedirect refusal.
//
// Redirects: a keyed request, or one whose headers came partly from
// PrepareRequest or name a secret header, is not followed to another
// origin (scheme and host): the 3xx response is returned instead, so the
// key, the body and credentials never reach a host the caller did not
// name. A redirect that changes the method (303, or 301/302 after POST)
// drops the key header.
func (c *Client) Do(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, fmt.Errorf("idemhttp: %w: nil request", ErrInvalidRequest)
	}
	if req.URL == nil {
		closeBody(req)
		return nil, fmt.Errorf("idemhttp: %w: nil URL", ErrInvalidRequest)
	}
	c.init()
	cfg := &c.cfg
	cfg.inflight.Add(1)
	defer cfg.inflight.Add(-1)
	p := &cfg.pol
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, err // nothing sent, nothing journaled
	}

	key, explicit, err := callerKey(ctx, req.Header, p.keyHeader)
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
		j = cfg.journal
		if j == nil && hasOp {
			j = cfg.mem
		}
	}
	body, getBody, err := replayableBody(req, j != nil, p.maxBody)
	if err != nil {
		return nil, err
	}

	a := &attempt{c: c, cfg: cfg, p: p.apply(ctx), operation: op, keyed: keyed, safe: keyed || idempotentMethod(req.Method)}
	if j != nil {
		t0 := c.journalClock()
		e, created, err := c.begin(ctx, j, req, key, explicit, op, body)
		if cfg.hooks.OnJournal != nil {
			ev := idemtrace.JournalEvent{Op: idemtrace.JournalBegin, Operation: op, Err: err}
			if e != nil {
				ev.Key, ev.State, ev.Existing = e.Key, string(e.State), !created
			}
			c.journalEvent(ctx, ev, t0)
		}
		if err != nil {
			return nil, err
		}
		a.j, a.entry = j, e
		if created {
			a.fresh = key == "" // minted by begin for this call
			// A call that stops before its first attempt (a PrepareRequest
			// error or panic, an unreadable body) told its caller nothing
			// was sent; the entry must not let Resume send it later.
			defer a.discardUnsent(ctx)
		}
		key = e.Key
	} else if keyed && key == "" {
		key, a.fresh = NewKey(), true
	}
	a.key = key

	a.req = req // for the call's events until out replaces it
	out := req.WithContext(a.context(a.callStart(ctx)))
	a.req = out
	switch {
	case cfg.prepare != nil:
		out.Header = cloneWithoutFold(req.Header, p.keyHeader, true)
		u := *req.URL
		out.URL = &u
	case keyed:
		out.Header = cloneWithoutFold(req.Header, p.keyHeader, false)
	}
	if keyed {
		a.keyVal[0] = contract.FormatKeyHeader(key, p.quoteKey)
		out.Header[p.keyHeader] = a.keyVal[:]
	}
	if cfg.prepare != nil {
		if err := cfg.prepare(out); err != nil {
			if getBody != nil {
				closeBody(req)
			}
			return a.end(nil, fmt.Errorf("idemhttp: prepare request: %w", err))
		}
		if out.Header == nil {
			out.Header = make(http.Header)
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
		switch mem := inMemory(req.Body); {
		case mem != nil && trustedBody(req, mem):
			a.firstBody, a.trusted = req.Body, true
		case mem != nil:
			a.bodyRef.done(hashInMemory(mem))
			a.firstBody = req.Body
		default:
			a.first.reset(req.Body, &a.bodyRef, false)
			a.firstBody = &a.first
		}
		a.getBody = getBody
		a.probing = true // SetBody reads the body once to measure it
		err = rreq.SetBody(retryablehttp.ReaderFunc(a.body))
		a.probing = false
		rreq.ContentLength = req.ContentLength
	}
	if err != nil {
		if getBody != nil {
			closeBody(req)
		}
		return a.end(nil, fmt.Errorf("idemhttp: %w: body: %w", ErrNotReplayable, err))
	}

	a.engine = retryablehttp.Client{
		HTTPClient:   cfg.hc,
		RetryMax:     math.MaxInt32, // checkRetry decides when to stop
		CheckRetry:   engineCheckRetry,
		Backoff:      engineBackoff,
		PrepareRetry: enginePrepareRetry,
		ErrorHandler: engineErrorHandler,
	}
	if cfg.hooks.OnAttempt != nil || cfg.hooks.OnAttemptDone != nil {
		a.engine.RequestLogHook = engineRequestHook
	}
	a.started = true
	resp, err := a.finish(a.engine.Do(rreq))
	if a.firstBody != nil {
		_ = a.firstBody.Close() // never sent; net/http would have closed it
	}
	if a.entry != nil {
		c.record(ctx, a.j, a.entry, outcomeState(err), a.lastStatus, a.attempts)
	}
	return a.end(resp, err)
}

// discardUnsent removes the journal entry of a call that created it and
// stopped before its first attempt. It runs deferred, so a panic in
// PrepareRequest is covered too. Should the removal fail, the entry is
// marked abandoned instead: Resume never sends either.
func (a *attempt) discardUnsent(ctx context.Context) {
	if a.started {
		return
	}
	ctx = context.WithoutCancel(ctx)
	t0 := a.c.journalClock()
	err := a.j.Delete(ctx, a.entry.Key)
	if err == nil || errors.Is(err, ErrNotFound) {
		a.c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: a.entry.Key, Operation: a.entry.Operation}, t0)
		return
	}
	err2 := a.j.Finish(ctx, a.entry.Key, Outcome{State: StateAbandoned, At: a.c.stamp(a.j)})
	a.c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalDiscard, Key: a.entry.Key, Operation: a.entry.Operation, State: string(StateAbandoned), Err: errors.Join(err, err2)}, t0)
	if a.cfg.logger != nil {
		a.cfg.logger.LogAttrs(ctx, slog.LevelError, "idemhttp: journal: could not withdraw an entry that was never sent",
			slog.String("key", a.entry.Key), slog.String("error", errors.Join(err, err2).Error()))
	}
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
// created reports whether the entry is this call's own.
//
// An operation's journaled key wins over a key in the request's header:
// the caller declared the operation's identity with WithOperation, and an
// SDK that mints a key per call (stripe-go does) would otherwise make a
// rerun of the operation a new one. A key given with WithKey that differs
// from the journal's is a conflict.
func (c *Client) begin(ctx context.Context, j Journal, req *http.Request, key string, explicit bool, op string, body []byte) (e *Entry, created bool, err error) {
	p := &c.cfg.pol
	url, err := contract.JournalURLOf(req.URL, p.redactQuery)
	if err != nil {
		return nil, false, err
	}
	fp := contract.Fingerprint(req.Method, url, body)
	candidate := key
	if candidate == "" {
		candidate = NewKey()
	}
	h := req.Header.Clone()
	contract.DropSecrets(h, p.keyHeader, c.cfg.secrets)
	now := c.stamp(j)
	e = &Entry{
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
		return nil, false, fmt.Errorf("idemhttp: journal: %w", err)
	}
	if existing == nil {
		return e, true, nil
	}
	if explicit && existing.Key != key {
		return nil, false, fmt.Errorf("idemhttp: %w: operation %q has key %s in the journal, request has %s", ErrKeyConflict, op, existing.Key, key)
	}
	if existing.Fingerprint != fp {
		return nil, false, &KeyMismatchError{Key: existing.Key, Operation: existing.Operation}
	}
	if existing.State == StateDone {
		return nil, false, &DoneError{Operation: existing.Operation, Key: existing.Key, Status: existing.LastStatus, Attempts: existing.Attempts, Finished: existing.Updated}
	}
	// The entry's age is judged by the clock that stamped it.
	now, err = c.journalNow(ctx, j)
	if err != nil {
		return nil, false, fmt.Errorf("idemhttp: journal: %w", err)
	}
	if contract.Latest(existing.Created, existing.Updated).After(now.Add(ClockTolerance)) {
		return nil, false, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", existing.Operation, existing.Key, existing.Created.Format(time.RFC3339), ErrClockJump)
	}
	// The entry's own times may be older than the clock while newer
	// entries, pruned since, showed the clock was set back: then this
	// entry's age, checked below against the retention, is not known.
	mark, err := journalHighWater(ctx, j)
	if err != nil {
		return nil, false, fmt.Errorf("idemhttp: journal: %w", err)
	}
	if mark.After(now.Add(ClockTolerance)) {
		return nil, false, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w: the journal holds times up to %s, the clock says %s",
			existing.Operation, existing.Key, existing.Created.Format(time.RFC3339), ErrClockJump, mark.Format(time.RFC3339), now.Format(time.RFC3339))
	}
	if existing.State == StateAbandoned || now.Sub(existing.Created) > p.retention {
		return nil, false, fmt.Errorf("idemhttp: operation %q (key %s, created %s): %w", existing.Operation, existing.Key, existing.Created.Format(time.RFC3339), ErrKeyExpired)
	}
	return existing, false, nil
}

// retainer is implemented by a [Journal] that prunes done entries by
// itself: it must keep them for the client's Policy.Retention.
type retainer interface {
	Retain(d time.Duration)
}

// journalClock is implemented by a [Journal] that keeps its own clock: it
// stamps the entries and outcomes it is given with zero times, and the
// client judges their ages by Now, so that one clock ages the entries of
// every process sharing the journal.
type journalClock interface {
	Now(ctx context.Context) (time.Time, error)
}

// stamp returns the time to write into an entry or outcome for j: zero
// for a journal with its own clock, which stamps it, else the client's.
func (c *Client) stamp(j Journal) time.Time {
	if _, ok := j.(journalClock); ok {
		return time.Time{}
	}
	return c.cfg.now()
}

// journalNow returns the time by which j's entries are aged: j's own
// clock when it keeps one, else the client's.
func (c *Client) journalNow(ctx context.Context, j Journal) (time.Time, error) {
	if jc, ok := j.(journalClock); ok {
		t, err := jc.Now(ctx)
		if err != nil {
			return time.Time{}, fmt.Errorf("clock: %w", err)
		}
		return t, nil
	}
	return c.cfg.now(), nil
}

// record writes a call's outcome to its journal entry. A failure here
// cannot change the call's result (the request already went out), and
// leaves the entry pending, which Resume resolves by resending with the
// same key; so it is logged, not returned.
func (c *Client) record(ctx context.Context, j Journal, e *Entry, s State, status, attempts int) {
	if e == nil {
		return
	}
	t0 := c.journalClock()
	err := j.Finish(context.WithoutCancel(ctx), e.Key, Outcome{State: s, Status: status, Attempts: attempts, At: c.stamp(j)})
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalFinish, Key: e.Key, Operation: e.Operation, State: string(s), Err: err}, t0)
	if err != nil && c.cfg.logger != nil {
		c.cfg.logger.LogAttrs(ctx, slog.LevelWarn, "idemhttp: journal finish failed; entry stays pending",
			slog.String("key", e.Key), slog.String("state", string(s)), slog.String("error", err.Error()))
	}
}

// StandardClient returns an [http.Client] that sends every request
// through c, so any SDK that accepts an *http.Client gets keys and safe
// retries. A key the SDK sets itself (stripe-go sets Idempotency-Key) is
// kept, not replaced, except under [WithOperation] with a journal, where
// the journal's key for the operation wins. Errors reach the SDK wrapped in
// [*url.Error]; errors.Is and errors.As still see the typed errors of
// [Client.Do]. Its CloseIdleConnections does nothing: the pool belongs to
// c.HTTPClient. Its Transport is the [http.RoundTripper] to hand a library
// that wants one.
//
// Turn the SDK's own retries off. An SDK that retries by itself
// multiplies attempts (stripe-go's default of 2 network retries on top of
// the Policy's 4 attempts is up to 12 requests per call) and its retries
// bypass the retry budget, the deadline rules and the in-progress
// patience. With stripe-go:
//
//	stripe.NewBackendsWithConfig(&stripe.BackendConfig{
//		HTTPClient:        c.StandardClient(),
//		MaxNetworkRetries: stripe.Int64(0), // idemhttp retries
//	})
func (c *Client) StandardClient() *http.Client {
	return &http.Client{Transport: roundTripper{c}}
}

type roundTripper struct{ c *Client }

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) { return t.c.Do(req) }
