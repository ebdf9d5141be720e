package idemserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
)

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
// handler. For each request whose method is configured and that carries a
// valid key, it claims (principal, key) in the [Store] with one atomic step,
// then:
//
//   - new key: runs the handler, capturing status, header and body as they
//     pass to the client; stores the response if ShouldStore accepts its
//     status, else releases the key so a retry runs again;
//   - same key and request, still running: 409 with Retry-After;
//   - same key, different request (method, path, query or body): 422;
//   - same key and request, completed: replays the stored status, header
//     and body with [ReplayedHeader] "true", without running the handler.
//
// Errors are RFC 9457 problems (see [Problem] and the Type constants).
// Requests with other methods, and keyless requests unless Required, reach
// the handler untouched.
//
// A handler that panics releases its key and the panic continues to
// net/http, which aborts the connection and logs it; the middleware does not
// turn panics into 500s, which would hide them from outer middleware.
//
// The lock timeout trades two failures against each other. A server that
// crashes mid-request leaves its claim behind, and the key answers 409
// until LockTimeout passes; but a handler that runs longer than LockTimeout
// loses its claim, so a retry arriving after that runs the handler a second
// time, and the late response is sent but not stored. Set LockTimeout well
// above the handler's slowest run.
//
// The zero value works: POST and PATCH, optional keys in either form, a
// [MemoryStore], a 24 h TTL. Fields are read by Wrap; changing them later
// has no effect on handlers already wrapped. Wrapped handlers are safe for
// concurrent use.
type Middleware struct {
	// Store keeps claims and responses. Nil means a new [MemoryStore] for
	// each call to Wrap: set Store to share one between handlers, and use a
	// shared store (Redis, PostgreSQL) when several processes serve the
	// same keys.
	Store Store

	// Principal returns the scope of a request's keys: the tenant, account
	// or API key that sent it, so that one principal can never replay, block
	// or probe another's response. Nil means one scope for all requests,
	// right only when a single party uses the server.
	Principal func(r *http.Request) string

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
	// handler does not run. Zero or negative means [DefaultMaxBodyBytes].
	MaxBodyBytes int64

	// MaxStoredBody bounds the response body kept for replays. A larger
	// response still reaches the client, but is not stored: the key is
	// released and a retry runs the handler again. Zero or negative means
	// [DefaultMaxStoredBody].
	MaxStoredBody int

	// ShouldStore reports whether a response with the given status is
	// stored and replayed; otherwise the key is released. Nil means
	// [DefaultShouldStore].
	ShouldStore func(status int) bool

	// WriteError writes the middleware's own error responses; the status
	// and any Retry-After header are already decided. Nil means
	// [WriteProblem] (application/problem+json).
	WriteError func(w http.ResponseWriter, r *http.Request, p *Problem)

	// Logger receives store errors at Error level: a failed Claim or a
	// corrupt stored record (the request was answered 503), and a failed
	// Complete or Release after the response was sent (the response then
	// goes unstored, or the key stays claimed until LockTimeout). Nil
	// means [slog.Default].
	Logger *slog.Logger
}

// DefaultShouldStore is the default storage rule: 2xx, 3xx and the 4xx a
// retry of the same request would get again. Not stored: 5xx, which the
// next attempt may not repeat, and 401, 403, 408, 409, 423, 425 and 429,
// which depend on credentials, permissions, load or other requests rather
// than on the request itself.
func DefaultShouldStore(status int) bool {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusRequestTimeout,
		http.StatusConflict, http.StatusLocked, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 200 && status < 500
}

// Wrap returns a handler that enforces the idempotency contract around h.
func (m *Middleware) Wrap(h http.Handler) http.Handler {
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
		shouldStore: m.ShouldStore,
		writeError:  m.WriteError,
		logger:      m.Logger,
		tokenPrefix: newTokenPrefix(),
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
	if mw.maxBody <= 0 {
		mw.maxBody = DefaultMaxBodyBytes
	}
	if mw.maxStored <= 0 {
		mw.maxStored = DefaultMaxStoredBody
	}
	if mw.shouldStore == nil {
		mw.shouldStore = DefaultShouldStore
	}
	if mw.writeError == nil {
		mw.writeError = func(w http.ResponseWriter, _ *http.Request, p *Problem) { WriteProblem(w, p) }
	}
	if mw.logger == nil {
		mw.logger = slog.Default()
	}
	return mw
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
	shouldStore func(int) bool
	writeError  func(http.ResponseWriter, *http.Request, *Problem)
	logger      *slog.Logger
	tokenPrefix string
	tokens      atomic.Uint64
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(h.methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	values := r.Header[h.header]
	switch {
	case len(values) == 0 && h.required:
		h.writeError(w, r, problemKeyMissing(h.header))
		return
	case len(values) == 0:
		h.next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		h.writeError(w, r, problemKeyInvalid(h.header, "The request carries more than one "+h.header+" header."))
		return
	}
	key, err := parseKey(values[0], h.form)
	if err != nil {
		h.writeError(w, r, problemKeyInvalid(h.header, err.Error()))
		return
	}
	body, err := readBody(r, h.maxBody)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			h.writeError(w, r, problemBodyTooLarge(h.maxBody))
		} else {
			h.writeError(w, r, problemBodyUnreadable())
		}
		return
	}
	r.Body = newBodyReader(body)

	fp := fingerprint(r, body)
	scope := ""
	if h.principal != nil {
		scope = h.principal(r)
	}
	storeKey := scopedKey(scope, key)
	token := string(strconv.AppendUint([]byte(h.tokenPrefix), h.tokens.Add(1), 36))

	res, err := h.store.Claim(r.Context(), storeKey, Claim{Token: token, Fingerprint: fp, LockTimeout: h.lockTimeout})
	if err == nil && (res.State < Claimed || res.State > Completed) {
		// Running the handler on a result we cannot trust could run it twice.
		err = fmt.Errorf("idemserver: store returned an invalid claim state %d", res.State)
	}
	switch {
	case err != nil:
		h.storeFailed(w, r, key, err)
	case res.State == Claimed:
		h.run(w, r, storeKey, token)
	case res.Fingerprint != fp:
		h.writeError(w, r, problemKeyMismatch(h.header, key))
	case res.State == InProgress:
		w.Header().Set("Retry-After", h.retryAfter)
		h.writeError(w, r, problemInProgress(h.header, key))
	default:
		if err := replay(w, res.Record); err != nil {
			h.storeFailed(w, r, key, err)
		}
	}
}

// storeFailed answers 503 when the store cannot say what became of a key:
// without that, running the handler could run it twice.
func (h *handler) storeFailed(w http.ResponseWriter, r *http.Request, key string, err error) {
	h.logger.ErrorContext(r.Context(), "idemserver: store failed; answered 503", "key", key, "error", err)
	w.Header().Set("Retry-After", h.retryAfter)
	h.writeError(w, r, problemStoreUnavailable(key))
}

// run serves a request whose key this process has just claimed, then
// stores the response or releases the key.
func (h *handler) run(w http.ResponseWriter, r *http.Request, storeKey, token string) {
	// The request's context ends when the client leaves, but the work is
	// done by then and its outcome must still be recorded.
	ctx := context.WithoutCancel(r.Context())
	rec := &recorder{rw: w, limit: h.maxStored}
	returned := false
	defer func() {
		if returned {
			return
		}
		// The handler panicked (or called runtime.Goexit): release the
		// key so a retry can run, and let the panic continue unrecovered,
		// with its original stack, to net/http.
		if err := h.store.Release(ctx, storeKey, token); err != nil {
			h.logger.ErrorContext(ctx, "idemserver: release after panic failed", "error", err)
		}
	}()
	h.next.ServeHTTP(rec, r)
	returned = true

	rec.finish()
	if rec.storable() && h.shouldStore(rec.status) {
		if err := h.store.Complete(ctx, storeKey, token, rec.takeRecord(), h.ttl); err != nil {
			h.logger.ErrorContext(ctx, "idemserver: response not stored", "status", rec.status, "error", err)
		}
		return
	}
	if err := h.store.Release(ctx, storeKey, token); err != nil {
		h.logger.ErrorContext(ctx, "idemserver: release failed", "status", rec.status, "error", err)
	}
}

// replay sends a stored response record, marked as a replay. A corrupt
// record is refused before anything is written.
func replay(w http.ResponseWriter, record []byte) error {
	hdr := w.Header()
	status, body, err := parseRecord(record, hdr)
	if err != nil {
		return err
	}
	hdr.Set(ReplayedHeader, "true")
	w.WriteHeader(status)
	_, _ = w.Write(body) // a failed write means the client left
	return nil
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

// readBody reads the whole request body, refusing more than limit bytes.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errTooLarge
	}
	if r.ContentLength >= 0 {
		// net/http's body reader stops at Content-Length, so one exact
		// read is the whole body.
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, err
		}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, errTooLarge
	}
	return body, nil
}
