package idemtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/contract"
)

// maxPeek bounds the body the fault layer reads to find the operation; the
// middleware applies its own limit to what follows.
const maxPeek = 1 << 20

// Options configures a [Server]. The zero value (or a nil *Options) is an
// IETF-style server without faults: keys optional, both key forms accepted,
// errors as problem+json, replays marked Idempotent-Replayed: true.
type Options struct {
	// Faults to inject; the zero value injects none.
	Faults Faults

	// RequireKey makes the key mandatory for POST and PATCH: a request
	// without one gets 400 (the IETF draft's "key missing" problem).
	RequireKey bool

	// KeyForm restricts the key header to the bare or the quoted form.
	KeyForm idemserver.KeyForm

	// StripeErrors renders errors as Stripe does: a reused key is 400
	// {"error":{"type":"idempotency_error",...}} instead of a 422 problem,
	// and Stripe-Should-Retry accompanies 409, 503 and reused keys.
	StripeErrors bool

	// OmitReplayHeader leaves the Idempotent-Replayed header off replays,
	// like servers that replay silently.
	OmitReplayHeader bool

	// Now is the server's clock, for outage windows, charge timestamps and
	// the default store's TTL; nil means [time.Now].
	Now func() time.Time

	// Store keeps keys; nil means an [idemserver.MemoryStore] on Now.
	Store idemserver.Store

	// TTL and LockTimeout are passed to the middleware; zero means its
	// defaults (24 h and 1 min).
	TTL         time.Duration
	LockTimeout time.Duration

	// Listener, when set, is where the server listens instead of a new
	// loopback port, and URL is http:// and its address (an unspecified
	// address such as 0.0.0.0 is given as 127.0.0.1). Close closes it.
	// A program serving on a chosen address (idemctl serve) listens
	// itself and so gets the error, where NewServer would panic.
	Listener net.Listener
}

// Server is a fake Stripe-style API on a loopback listener, built on
// [idemserver.Middleware], that injects faults and counts the side effects
// it executes, so tests can prove that retries never run an operation twice
// and never lose one.
//
// Endpoints: POST /v1/charges creates a Stripe-like charge (form or JSON
// parameters amount and currency, the body decoded by the rule of
// [Operation]); any other path performs a generic operation for every
// method but GET and HEAD, which report status.
//
// Each request belongs to an operation: the body's "operation" member (JSON)
// or operation / metadata[operation] field (form), else its idempotency
// key, else "". Side effects are counted per operation, and fault decisions
// are made per operation (see [Faults]). Keys are scoped by the
// Authorization header, so two API keys never share idempotency keys;
// requests without one share a scope of their own, "anonymous" (a test
// server's choice: a real one authenticates first, and idemserver refuses
// a request its Principal cannot name).
//
// A Server is safe for concurrent use. Close it when done.
type Server struct {
	// URL is the base URL of the server, http://127.0.0.1:port, with no
	// trailing slash.
	URL string

	ts         *httptest.Server
	faults     Faults
	now        func() time.Time
	start      time.Time
	retryAfter string
	writeError func(http.ResponseWriter, *http.Request, *idemserver.Problem)
	omitReplay bool
	inner      http.Handler // the middleware around the app

	mu         sync.Mutex
	ops        map[string]*opState // fault decisions per operation
	executions map[string]int      // side effects per operation

	requests   atomic.Int64
	replays    atomic.Int64
	conflicts  atomic.Int64
	mismatches atomic.Int64
	injected   [len(rated) + 2]atomic.Int64 // per rated kind, then outages and rate-limited
	seq        atomic.Int64                 // object ids
	limiter    *bucket                      // nil: no rate limit

	done      chan struct{} // closed by Close: ends slow replies
	closeOnce sync.Once

	slowHook func() // test seam: called when a slow reply or the latency starts waiting
}

// NewServer starts a Server on a loopback port; nil opts means the zero
// [Options]. It panics if it cannot listen, as [httptest.NewServer] does.
func NewServer(opts *Options) *Server {
	return newServer(opts, nil)
}

// newServer is NewServer with the test seams, set before the listener
// starts so no request can race with them.
func newServer(opts *Options, slowHook func()) *Server {
	if opts == nil {
		opts = &Options{}
	}
	s := &Server{
		faults:     opts.Faults,
		now:        opts.Now,
		retryAfter: retryAfterValue(opts.Faults.RetryAfter),
		writeError: func(w http.ResponseWriter, _ *http.Request, p *idemserver.Problem) { idemserver.WriteProblem(w, p) },
		omitReplay: opts.OmitReplayHeader,
		ops:        make(map[string]*opState),
		executions: make(map[string]int),
		done:       make(chan struct{}),
		slowHook:   slowHook,
	}
	s.faults.Outages = append([]Window(nil), opts.Faults.Outages...)
	if s.now == nil {
		s.now = time.Now
	}
	s.start = s.now()
	if opts.StripeErrors {
		s.writeError = writeStripeProblem
	}
	store := opts.Store
	if store == nil {
		store = &idemserver.MemoryStore{Now: s.now}
	}
	retryAfter := opts.Faults.RetryAfter
	if retryAfter <= 0 {
		retryAfter = -1 // the middleware's spelling of "Retry-After: 0"
	}
	mw := &idemserver.Middleware{
		Store:       store,
		Principal:   principal,
		Required:    opts.RequireKey,
		KeyForm:     opts.KeyForm,
		TTL:         opts.TTL,
		LockTimeout: opts.LockTimeout,
		RetryAfter:  retryAfter,
		ShouldStore: func(status int) bool {
			// Stored 500s are the point of FaultStored500; the app
			// answers 500 for nothing else.
			return idemserver.DefaultShouldStore(status) || status == http.StatusInternalServerError
		},
		WriteError: s.writeError,
		Logger:     warnLogger,
	}
	if f := opts.Faults; f.RateLimit > 0 {
		s.limiter = newBucket(f.RateLimit, f.RateBurst, s.start)
	}
	s.inner = mw.Wrap(s.app())
	if opts.Listener == nil {
		s.ts = httptest.NewServer(http.HandlerFunc(s.serve))
		s.URL = s.ts.URL
		return s
	}
	s.ts = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	_ = s.ts.Listener.Close() // the loopback port it opened, unused
	s.ts.Listener = opts.Listener
	s.ts.Start()
	s.URL = "http://" + urlHost(opts.Listener.Addr())
	return s
}

// urlHost renders a listener's address for a URL, an unspecified IP (a
// listener on every interface) as loopback.
func urlHost(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(ta.Port))
	}
	return a.String()
}

// Client returns an HTTP client configured for the server, whose idle
// connections Close shuts.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Close ends slow replies at once, shuts the listener and waits for the
// requests in flight. It may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.ts.Close()
	})
}

// Executions returns how many times op's side effect ran: 1 for an
// operation done once, more for duplicates.
func (s *Server) Executions(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.executions[op]
}

// Snapshot returns the side effects executed so far, per operation.
func (s *Server) Snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.executions)
}

// Stats counts what the server saw and did.
type Stats struct {
	// Requests counts the requests received, dropped ones included. It
	// counts more than a client's attempts when net/http's Transport
	// resends a keyed request by itself, which it does once when a reused
	// connection closes without a reply.
	Requests   int
	Executions int // side effects executed, over all operations
	Operations int // operations executed at least once
	Duplicates int // executions beyond the first of their operation; 0 when retries are safe
	Replays    int // responses replayed from the store
	Conflicts  int // 409s from the middleware (a duplicate in flight); injected ones are in Faults
	Mismatches int // keys refused as reused for a different request
	// Faults counts the requests that got each fault (each 409 of a
	// conflict burst counts); every kind is present.
	Faults map[FaultKind]int
}

// String renders the stats on one line, kinds in decision order.
func (st Stats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "requests=%d executions=%d operations=%d duplicates=%d replays=%d conflicts=%d mismatches=%d",
		st.Requests, st.Executions, st.Operations, st.Duplicates, st.Replays, st.Conflicts, st.Mismatches)
	for _, k := range FaultKinds() {
		fmt.Fprintf(&b, " %s=%d", k, st.Faults[k])
	}
	return b.String()
}

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	st := Stats{
		Requests:   int(s.requests.Load()),
		Replays:    int(s.replays.Load()),
		Conflicts:  int(s.conflicts.Load()),
		Mismatches: int(s.mismatches.Load()),
		Faults:     make(map[FaultKind]int, len(s.injected)),
	}
	for i, k := range rated {
		st.Faults[k] = int(s.injected[i].Load())
	}
	st.Faults[FaultOutage] = int(s.injected[len(rated)].Load())
	st.Faults[FaultRateLimited] = int(s.injected[len(rated)+1].Load())
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.executions {
		st.Executions += n
		st.Operations++
		st.Duplicates += n - 1
	}
	return st
}

// execute performs op's side effect and returns its execution number.
func (s *Server) execute(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.executions[op]++
	return s.executions[op]
}

// count records an injected fault.
func (s *Server) count(k FaultKind) {
	for i, r := range rated {
		if r == k {
			s.injected[i].Add(1)
			return
		}
	}
	if k == FaultRateLimited {
		s.injected[len(rated)+1].Add(1)
		return
	}
	s.injected[len(rated)].Add(1)
}

// decide picks the fault for a request of op: an outage, the rate limit,
// then the per-operation draw (which outages and the rate limit leave
// untouched).
func (s *Server) decide(op string, keyed bool) FaultKind {
	now := s.now()
	if s.faults.inOutage(now.Sub(s.start)) {
		return FaultOutage
	}
	if s.limiter != nil && !s.limiter.take(now) {
		return FaultRateLimited
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.ops[op]
	if st == nil {
		st = new(opState)
		s.ops[op] = st
	}
	return s.faults.decide(st, op, keyed)
}

// serve is the fault layer in front of the middleware.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	peek, err := io.ReadAll(io.LimitReader(r.Body, maxPeek))
	if err != nil {
		// Returning without a reply would send an empty 200.
		s.writeError(w, r, &idemserver.Problem{Type: idemserver.TypeBodyUnreadable, Title: "Request body unreadable", Status: http.StatusBadRequest, Detail: "The request body could not be read."})
		return
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(peek), r.Body), r.Body}

	op := Operation(r.Header.Get("Content-Type"), peek)
	if op == "" {
		if key, err := contract.ParseKeyHeader(r.Header.Get(idemhttp.DefaultKeyHeader)); err == nil {
			op = key
		}
	}
	ctx := context.WithValue(r.Context(), opCtxKey, op)
	kind := s.decide(op, r.Header.Get(idemhttp.DefaultKeyHeader) != "")
	if kind != "" {
		s.count(kind)
	}
	if kind != FaultOutage && kind != FaultRateLimited && !s.wait(r, s.faults.Latency) {
		s.drop(w) // the client left, or the server is closing: nothing ran
		return
	}
	switch kind {
	case FaultDropRequest:
		s.drop(w)
		return
	case FaultRateLimited:
		w.Header().Set("Retry-After", s.retryAfter)
		s.writeError(w, r, &idemserver.Problem{Type: TypeRateLimited, Title: "Too many requests", Status: http.StatusTooManyRequests, Detail: "The request rate is over the limit (an injected fault); retry later."})
		return
	case FaultOutage:
		w.Header().Set("Retry-After", s.retryAfter)
		s.writeError(w, r, &idemserver.Problem{Type: TypeOutage, Title: "Service unavailable", Status: http.StatusServiceUnavailable, Detail: "The service is down (an injected outage)."})
		return
	case FaultUnavailable:
		w.Header().Set("Retry-After", s.retryAfter)
		s.writeError(w, r, &idemserver.Problem{Type: TypeUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable, Detail: "The service is overloaded (an injected fault); retry later."})
		return
	case FaultConflict:
		// Indistinguishable from the middleware's own 409: the point is to
		// exercise the client's in-progress handling.
		w.Header().Set("Retry-After", s.retryAfter)
		s.writeError(w, r, &idemserver.Problem{Type: idemserver.TypeInProgress, Title: "A request is outstanding for this Idempotency-Key", Status: http.StatusConflict, Detail: "A request with the same key is still being processed (an injected fault)."})
		return
	case FaultStored500:
		ctx = context.WithValue(ctx, failCtxKey, true)
	case FaultDropResponse:
		var buf bufferedResponse
		s.inner.ServeHTTP(s.observe(&buf), r.WithContext(ctx))
		s.drop(w)
		return
	case FaultSlow:
		var buf bufferedResponse
		s.inner.ServeHTTP(s.observe(&buf), r.WithContext(ctx))
		if s.wait(r, s.faults.slowDelay()) {
			buf.sendTo(w)
		} else {
			// The client gave up (nobody to answer), or the server
			// closes (a handler returning silently would send an empty
			// 200).
			s.drop(w)
		}
		return
	}
	s.inner.ServeHTTP(s.observe(w), r.WithContext(ctx))
}

// wait waits d, or less when the client goes away or the server closes,
// and reports whether the full wait elapsed.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	if s.slowHook != nil {
		s.slowHook()
	}
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
	case <-s.done:
	}
	return false
}

// drop closes the connection without a reply. Without a hijackable
// connection (HTTP/2), aborting the handler resets the stream instead.
func (s *Server) drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// observe wraps w to count replays, conflicts and mismatches as the
// middleware answers, and to strip the replay header when asked to.
func (s *Server) observe(w http.ResponseWriter) http.ResponseWriter {
	return &observer{ResponseWriter: w, s: s}
}

type observer struct {
	http.ResponseWriter
	s           *Server
	wroteHeader bool
}

func (o *observer) WriteHeader(code int) {
	if !o.wroteHeader && code >= 200 {
		o.wroteHeader = true
		h := o.Header()
		if h.Get(idemserver.ReplayedHeader) == "true" {
			o.s.replays.Add(1)
			if o.s.omitReplay {
				h.Del(idemserver.ReplayedHeader)
			}
		}
		switch {
		case code == http.StatusConflict:
			o.s.conflicts.Add(1)
		case code == http.StatusUnprocessableEntity || h.Get("Stripe-Should-Retry") == "false":
			o.s.mismatches.Add(1)
		}
	}
	o.ResponseWriter.WriteHeader(code)
}

func (o *observer) Write(p []byte) (int, error) {
	if !o.wroteHeader {
		o.WriteHeader(http.StatusOK)
	}
	return o.ResponseWriter.Write(p)
}

// Unwrap exposes the underlying writer to [http.ResponseController].
func (o *observer) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// bufferedResponse holds a response for a reply that is delayed or dropped.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header {
	if b.header == nil {
		b.header = make(http.Header)
	}
	return b.header
}

func (b *bufferedResponse) WriteHeader(code int) {
	if b.status == 0 && code >= 200 {
		b.status = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedResponse) sendTo(w http.ResponseWriter) {
	maps.Copy(w.Header(), b.header)
	if b.status == 0 {
		b.status = http.StatusOK
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

func bodyOf(r *http.Request) []byte {
	b, _ := io.ReadAll(r.Body)
	return b
}

// bucket is a token bucket on the server's clock: rate tokens a second, up
// to burst. Safe for concurrent use.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int, now time.Time) *bucket {
	b := float64(burst)
	if burst <= 0 {
		b = max(1, rate)
	}
	return &bucket{rate: rate, burst: b, tokens: b, last: now}
}

// take spends a token if there is one at now. A clock that goes back
// adds nothing.
func (b *bucket) take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// retryAfterValue renders d as delta-seconds, rounded up; 0 or less is "0".
func retryAfterValue(d time.Duration) string {
	if d <= 0 {
		return "0"
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// principal scopes a request's keys by its Authorization header, or
// "anonymous" without one; the prefix keeps an Authorization value from
// ever reading "anonymous".
func principal(r *http.Request) string {
	if a := r.Header.Get("Authorization"); a != "" {
		return "auth:" + a
	}
	return "anonymous"
}
