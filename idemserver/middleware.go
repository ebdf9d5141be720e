package idemserver

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/serverclock"
	"github.com/idemkit/idemhttp/internal/servercore"
)

func init() {
	// The simulator's seam (internal/serverclock): the process's clock
	// a Middleware's lock arithmetic reads, set back and forward per seed.
	serverclock.Register(func(mw any, now func() time.Time) { mw.(*Middleware).now = now })
}

// ReplayedHeader is the response header, set to "true", that marks a
// replayed response (Stripe's name, which idemhttp's client recognises).
const ReplayedHeader = "Idempotent-Replayed"

// Defaults for the zero [Middleware].
const (
	// DefaultTTL is how long a stored response is replayed: a day, like
	// Stripe's key retention.
	DefaultTTL = 24 * time.Hour
	// DefaultLockTimeout is how long a claim holds its key before it counts
	// as abandoned.
	DefaultLockTimeout = time.Minute
	// DefaultRetryAfter is the delay sent in Retry-After with 409 and 503.
	DefaultRetryAfter = time.Second
	// DefaultMaxBodyBytes is the largest request body read, in bytes.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultMaxStoredBody is the largest response body stored, in bytes.
	DefaultMaxStoredBody = 1 << 20
)

// Middleware enforces the idempotency-key contract for a [net/http]
// handler, as a shell of the server core that contrib/postgres's
// TxMiddleware shares (docs/server.md). For each request whose method is configured and that carries a
// valid key, it claims (principal, key) in the [Store] with one atomic step,
// then:
//
//   - new key: runs the handler, capturing status, header and body as they
//     pass to the client, and renewing the claim while it runs; stores the
//     response if ShouldStore accepts its status, else releases the key so
//     a retry runs again;
//   - same key and request, still running: 409 with Retry-After;
//   - same key, different request (method, path, query or body): 422;
//   - same key and request, completed: replays the stored status, header
//     and body with [ReplayedHeader] "true", without running the handler.
//
// Errors are RFC 9457 problems (see [Problem] and the Type constants).
// Requests with other methods, and keyless requests unless Required, reach
// the handler untouched.
//
// It fails closed: when it cannot tell whether the handler's effect
// happened, it never takes the path that could run it twice.
//
//   - A handler that panics releases its key and the panic continues to
//     net/http, which aborts the connection and logs it; the middleware
//     does not turn panics into 500s, which would hide them from outer
//     middleware. So does an OnClaim hook that panics for a new key,
//     before the handler runs. A handler that panics after it wrote a
//     status ShouldStore keeps (or hijacked the connection) answered, so
//     it ran: its key is kept completed, as not replayable (410). A ShouldStore that panics after the
//     handler ran keeps its key completed, as not replayable (410).
//   - A handler that returns without writing anything while its request's
//     context is done (the client left, a deadline passed) is taken to have
//     given up: its key is released, not stored as an empty 200. A handler
//     that completed its effect must write its status before returning.
//   - A response whose body exceeds MaxStoredBody reaches its client whole,
//     but is not stored; its key stays completed, as not replayable, for
//     TTL, and a retry gets 410 ([TypeNotReplayable]) instead of a second
//     run. So does a handler that hijacks the connection or answers 101
//     Switching Protocols: it ran, and what it sent cannot be replayed.
//   - A full store (see [ErrStoreFull]) and a failing store get 503 with
//     Retry-After, and the handler does not run. So does a store that does
//     not answer the claim within the request's context or the lock
//     timeout.
//   - A store that refuses the Complete after the handler (a blip, a Redis
//     past its memory) does not make a retry run it again: the Complete is
//     tried again, with the renewals' backoff, for as long as the claim's
//     lock is live, and after its first failure the claim is pinned for
//     the TTL ([Store.Renew]), so that should no Complete get through, the
//     key answers 409 for the TTL rather than run again. A store that
//     hangs holds a finished response no longer than the claim's lock;
//     past that, the response is sent unstored and the key stays claimed
//     (pinned, or until its lock times out, as after a crash).
//
// The lock timeout is how long a crashed server's claim blocks its key
// (retries get 409 until it passes). A live handler keeps its claim however
// long it runs, by renewing it ([Store.Renew]) every tenth of LockTimeout;
// a renewal that fails is tried again promptly (a hundredth of LockTimeout
// after a fast failure, at once after a slow one; each attempt times out
// after a twentieth), so the claim survives any store outage that ends
// before LockTimeout has passed since the last renewal: any outage shorter
// than 0.85 LockTimeout, whenever it starts, and shorter than 0.95
// LockTimeout when it starts just after a renewal. Should a renewal find
// the claim lost (the store was unreachable for longer, or lost the
// record), the error is logged and the late response is sent but not
// stored.
//
// Replays carry what the handler set: the header fields outer middleware
// had set before the handler ran (a request id, CORS) are not stored, nor
// are hop-by-hop fields or Set-Cookie (a session must not be handed out
// again); ReplayHeaders and OmitHeaders choose further.
//
// Principal or SingleTenant must be set; the rest of the zero value works:
// POST and PATCH, optional keys in either form, a [MemoryStore], a 24 h
// TTL. Fields are read by [Middleware.Wrap];
// changing them later has no effect on handlers already wrapped. Wrapped
// handlers are safe for concurrent use.
type Middleware struct {
	// Store keeps claims and responses. Nil means a new [MemoryStore] for
	// each call to Wrap: set Store to share one between handlers, and use a
	// shared store (Redis, PostgreSQL) when several processes serve the
	// same keys.
	Store Store

	// Principal returns the scope of a request's keys: the tenant, account
	// or API key that sent it, so that one principal can never replay, block
	// or probe another's response. It must be set unless SingleTenant is.
	//
	// It must return a non-empty scope for every keyed request: a request
	// for which it returns "" (an unauthenticated caller, say) is refused
	// with 500 ([TypeNoPrincipal]) and runs nothing, since every such
	// caller would otherwise share one key space. Authenticate before the
	// middleware runs.
	Principal func(r *http.Request) string

	// SingleTenant says that one party alone sends every request, so that
	// all keys share one scope. It must be set, and is then the only
	// choice, when Principal is nil: a server with several callers that
	// forgot Principal would let one caller replay another's responses,
	// so that is never the default. Setting both is an error.
	SingleTenant bool

	// Methods lists the methods that take idempotency keys. Nil means POST
	// and PATCH. Other methods pass through untouched.
	Methods []string

	// Required makes the key mandatory for Methods: a request without one
	// gets 400 ([TypeKeyMissing]). When false, keyless requests pass through
	// untouched. A key that is present but invalid always gets 400.
	Required bool

	// KeyHeader names the key header; empty means "Idempotency-Key".
	KeyHeader string

	// KeyForm says which key header forms are accepted; the zero value,
	// [KeyFormAny], takes both the bare and the quoted form.
	KeyForm KeyForm

	// TTL is how long a stored response is replayed; zero means
	// [DefaultTTL]. After that the key is forgotten and may run again.
	TTL time.Duration

	// LockTimeout is how long a claim holds its key while the handler runs;
	// zero means [DefaultLockTimeout]. See the type's documentation for the
	// trade-off.
	LockTimeout time.Duration

	// RetryAfter is the delay sent in Retry-After with 409 (in progress) and
	// 503 (store unavailable), rounded up to whole seconds. Zero means
	// [DefaultRetryAfter]; a negative value sends "Retry-After: 0".
	RetryAfter time.Duration

	// MaxBodyBytes bounds the request body, which is read whole to be
	// fingerprinted; a larger body gets 413 ([TypeBodyTooLarge]) and the
	// handler does not run. The buffer grows with the bytes that arrive,
	// not with a declared Content-Length, so idle clients that declare
	// large bodies cost little. Zero or negative means
	// [DefaultMaxBodyBytes].
	MaxBodyBytes int64

	// MaxStoredBody bounds the response body kept for replays. A larger
	// response still reaches the client whole, but only a marker is
	// stored: the key stays completed for TTL and a retry gets 410
	// ([TypeNotReplayable]), since the handler ran and must not run again.
	// Zero or negative means [DefaultMaxStoredBody].
	MaxStoredBody int

	// ReplayHeaders, when not nil, lists the only response header fields
	// stored for replays (names in any case); Set-Cookie is replayed only
	// if it is listed. Nil means every field the handler set, except
	// Set-Cookie and OmitHeaders. Fields outer middleware set before the
	// handler ran and hop-by-hop fields are never stored.
	ReplayHeaders []string

	// OmitHeaders lists response header fields never stored for replays
	// (names in any case), such as a per-response trace id the handler
	// sets; it wins over ReplayHeaders.
	OmitHeaders []string

	// Fingerprint identifies a request for the key reuse check: a retry
	// must have the same fingerprint as the first request, or it gets 422.
	// body is the whole request body; the function must not keep it. Nil
	// means [DefaultFingerprint], which compares by meaning (JSON and form
	// bodies, query parameters) rather than by bytes.
	Fingerprint func(r *http.Request, body []byte) string

	// ShouldStore reports whether a response with the given status is
	// stored and replayed; otherwise the key is released. Nil means
	// [DefaultShouldStore].
	ShouldStore func(status int) bool

	// WriteError writes the middleware's own error responses; the status
	// and any Retry-After header are already decided. Nil means
	// [WriteProblem] (application/problem+json).
	WriteError func(w http.ResponseWriter, r *http.Request, p *Problem)

	// Logger receives store errors at Error level: a failed Claim or a
	// corrupt stored record (the request was answered 503), a failed
	// Complete, Release or Renew (the response then goes unstored, or the
	// key stays claimed until LockTimeout), and a Principal that returned
	// no scope (answered 500). A full store is logged at Warn level. A
	// [MemoryStore] (the default store) is announced at Info level, once
	// per store, when Wrap first uses it: what it holds, for how long,
	// and which stores to use past that. Nil means [slog.Default].
	Logger *slog.Logger

	// Hooks, when not nil, are called at each decision: claims, stored
	// responses, released keys, renewal failures, store errors and
	// refusals. Wrap copies the struct, so later changes to it
	// have no effect on handlers already wrapped. Nil costs nothing.
	Hooks *Hooks

	// now, when set (through internal/serverclock, by the simulator), is
	// the process's clock the lock arithmetic reads instead of time.Now.
	now func() time.Time
}

// ErrMisconfigured is what [Middleware.Wrap] panics with (wrapped, in an
// error saying which fields are wrong) for a Middleware whose fields
// contradict each other or leave a required choice open.
var ErrMisconfigured = errors.New("idemserver: misconfigured middleware")

// errNoPrincipal is the error of a [RefusedEvent] for a Principal that
// returned an empty scope.
var errNoPrincipal = errors.New("idemserver: Principal returned an empty scope")

// DefaultShouldStore is the default storage rule: 2xx, 3xx and the 4xx a
// retry of the same request would get again. Not stored: 5xx, which the
// next attempt may not repeat, and 401, 403, 408, 409, 423, 425 and 429,
// which depend on credentials, permissions, load or other requests rather
// than on the request itself.
func DefaultShouldStore(status int) bool { return servercore.DefaultShouldStore(status) }

// Wrap returns a handler that enforces the idempotency contract around h.
// It has the shape every router and middleware chain takes
// (func(http.Handler) http.Handler).
//
// Wrap panics, with an error wrapping [ErrMisconfigured], when the
// Middleware's fields do not make a safe configuration (neither Principal
// nor SingleTenant set, or both) or h is nil, as [http.ServeMux] panics on
// a bad pattern: the mistake is the program's, found where the routes are
// built, before any request is served, and a server that started anyway
// would serve one shared key space to every caller.
func (m *Middleware) Wrap(h http.Handler) http.Handler {
	if err := m.check(h); err != nil {
		panic(err)
	}
	return m.build(h)
}

// check returns the error Wrap panics with, or nil.
func (m *Middleware) check(h http.Handler) error {
	switch {
	case h == nil:
		return fmt.Errorf("%w: the wrapped handler is nil", ErrMisconfigured)
	case m.Principal == nil && !m.SingleTenant:
		return fmt.Errorf("%w: Principal is nil; set Principal to scope keys by caller, or SingleTenant if one party sends every request", ErrMisconfigured)
	case m.Principal != nil && m.SingleTenant:
		return fmt.Errorf("%w: both Principal and SingleTenant are set", ErrMisconfigured)
	}
	return nil
}

// copyHooks returns a copy of m.Hooks, nil if it is nil.
func (m *Middleware) copyHooks() *Hooks {
	if m.Hooks == nil {
		return nil
	}
	hk := *m.Hooks
	return &hk
}

// build resolves m's fields into a handler around h.
func (m *Middleware) build(h http.Handler) *handler {
	mw := &handler{
		next:        h,
		store:       m.Store,
		principal:   m.Principal,
		methods:     slices.Clone(m.Methods),
		required:    m.Required,
		header:      m.KeyHeader,
		form:        m.KeyForm,
		ttl:         m.TTL,
		lockTimeout: m.LockTimeout,
		retryAfter:  retryAfterValue(m.RetryAfter),
		maxBody:     m.MaxBodyBytes,
		maxStored:   m.MaxStoredBody,
		replayOnly:  canonicalNames(m.ReplayHeaders),
		omit:        canonicalNames(m.OmitHeaders),
		fingerprint: m.Fingerprint,
		writeError:  m.WriteError,
		logger:      m.Logger,
		hooks:       m.copyHooks(),
		tokenPrefix: newTokenPrefix(),
	}
	mw.core = servercore.Config{Mode: servercore.Streamed, ShouldStore: m.ShouldStore}
	if mw.fingerprint == nil {
		mw.fingerprint = DefaultFingerprint
		mw.core.DefaultFingerprint = true
	}
	if mw.store == nil {
		mw.store = new(MemoryStore)
	}
	if mw.methods == nil {
		mw.methods = []string{http.MethodPost, http.MethodPatch}
	}
	if mw.header == "" {
		mw.header = idemhttp.DefaultKeyHeader
	}
	mw.header = http.CanonicalHeaderKey(mw.header) // r.Header is indexed by canonical names
	if mw.ttl <= 0 {
		mw.ttl = DefaultTTL
	}
	if mw.lockTimeout <= 0 {
		mw.lockTimeout = DefaultLockTimeout
	}
	mw.renewer = newRenewer(mw, mw.lockTimeout)
	if m.now != nil {
		mw.renewer.clock = newSteadyClock(m.now)
	}
	if mw.maxBody <= 0 {
		mw.maxBody = DefaultMaxBodyBytes
	}
	if mw.maxStored <= 0 {
		mw.maxStored = DefaultMaxStoredBody
	}
	if mw.writeError == nil {
		mw.writeError = func(w http.ResponseWriter, _ *http.Request, p *Problem) { WriteProblem(w, p) }
	}
	if mw.logger == nil {
		mw.logger = slog.Default()
	}
	if ms, ok := mw.store.(*MemoryStore); ok {
		ms.announce(mw.logger, mw.ttl)
	}
	return mw
}

// canonicalNames returns names in canonical header form; nil stays nil.
func canonicalNames(names []string) []string {
	if names == nil {
		return nil
	}
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = http.CanonicalHeaderKey(n)
	}
	return out
}

// retryAfterValue renders d as a Retry-After delta-seconds value.
func retryAfterValue(d time.Duration) string {
	switch {
	case d == 0:
		d = DefaultRetryAfter
	case d < 0:
		return "0"
	}
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}

// newTokenPrefix returns random bytes that make claim tokens unique across
// processes; a counter makes them unique within one.
func newTokenPrefix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:]) + "-"
}

// handler is a wrapped handler with the Middleware's fields resolved.
type handler struct {
	next        http.Handler
	store       Store
	principal   func(*http.Request) string
	methods     []string
	required    bool
	header      string
	form        KeyForm
	ttl         time.Duration
	lockTimeout time.Duration
	retryAfter  string
	maxBody     int64
	maxStored   int
	replayOnly  []string // nil: all but Set-Cookie and omit
	omit        []string
	fingerprint func(*http.Request, []byte) string
	// core decides every keyed request: its claim, its end, its store
	// calls after the handler.
	core        servercore.Config
	writeError  func(http.ResponseWriter, *http.Request, *Problem)
	logger      *slog.Logger
	hooks       *Hooks // nil: none
	tokenPrefix string
	tokens      atomic.Uint64
	renewer     *renewer
}

// keepHeader reports whether a response header field the handler set,
// named in canonical form, is stored for replays.
func (h *handler) keepHeader(name string) bool {
	if slices.Contains(h.omit, name) {
		return false
	}
	if h.replayOnly != nil {
		return slices.Contains(h.replayOnly, name)
	}
	return name != "Set-Cookie"
}

var errTooLarge = errors.New("request body too large")

// bodyReader hands the buffered body to the handler; one allocation where
// io.NopCloser(bytes.NewReader(b)) makes two.
type bodyReader struct{ bytes.Reader }

func newBodyReader(b []byte) *bodyReader {
	br := new(bodyReader)
	br.Reset(b)
	return br
}

// Close does nothing: the server closes the connection's body itself.
func (*bodyReader) Close() error { return nil }

// minBodyBuf is the first buffer readBody reads into when the body is
// longer or of unknown length.
const minBodyBuf = 512

// readBody reads the whole request body, refusing more than limit bytes.
// The buffer grows with the bytes that arrive, doubling, and never from a
// declared Content-Length alone: a client that declares a megabyte and
// sends ten bytes costs ten bytes' buffer, not a megabyte.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errTooLarge
	}
	// net/http's body reader stops at Content-Length, so reading that many
	// bytes reads the whole body; with no length, read one byte past the
	// limit to tell a body at the limit from a longer one.
	want := limit
	if limit < math.MaxInt64 {
		want = limit + 1 // at math.MaxInt64, no body is longer anyway
	}
	if r.ContentLength >= 0 {
		want = r.ContentLength
	}
	if want == 0 {
		return nil, nil
	}
	body := make([]byte, 0, min(want, minBodyBuf))
	for int64(len(body)) < want {
		if len(body) == cap(body) {
			body = slices.Grow(body, int(min(want, int64(2*cap(body))))-len(body))
		}
		n, err := r.Body.Read(body[len(body):min(int64(cap(body)), want)])
		body = body[:len(body)+n]
		if err == io.EOF {
			if r.ContentLength >= 0 && int64(len(body)) < want {
				return nil, io.ErrUnexpectedEOF
			}
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if int64(len(body)) > limit {
		return nil, errTooLarge
	}
	return body, nil
}
