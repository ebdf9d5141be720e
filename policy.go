package idemhttp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Policy says which outcomes are retried, how long to wait, and how much
// retrying a client may do. The zero value of every field means the default
// given in its comment, so a Policy literal names only what it changes. A
// Client reads its Policy once, at its first use; changing the Policy
// afterwards has no effect on that Client.
type Policy struct {
	// MaxAttempts bounds attempts per call, the first included. 0 means 4;
	// 1 disables retries.
	MaxAttempts int

	// BaseDelay is the first backoff delay; later delays double, with ±50%
	// jitter, up to MaxDelay. 0 means 250 ms and 20 s.
	BaseDelay time.Duration
	MaxDelay  time.Duration

	// MaxRetryAfter is the longest Retry-After the client will wait. A
	// longer hint stops the call at once with [ErrRetryAfterTooLong]
	// instead of holding a goroutine for it. 0 means 60 s.
	MaxRetryAfter time.Duration

	// KeyMethods are the methods that get a minted idempotency key when the
	// request carries none. nil means POST and PATCH; an empty non-nil
	// slice means none.
	KeyMethods []string

	// KeyHeader is the header that carries the key. "" means
	// [DefaultKeyHeader] (Idempotency-Key).
	KeyHeader string

	// QuoteKey sends the key as the IETF draft's structured-field string
	// ("key") instead of bare (what Stripe and most servers expect).
	QuoteKey bool

	// MaxBodyBytes bounds how much of a body without GetBody the client
	// buffers to resend it; a larger body is refused with
	// [ErrNotReplayable] before anything is sent. It also bounds a body
	// written to a journal. 0 means 8 MiB.
	MaxBodyBytes int64

	// Retention is how long the server keeps a key (24 h at Stripe). A
	// journaled operation older than this is not resent ([ErrKeyExpired])
	// and done entries are pruned after it. 0 means 24 h.
	Retention time.Duration

	// HonorShouldRetry makes a Stripe-Should-Retry: true/false response
	// header override the status rules. [StripePolicy] sets it.
	HonorShouldRetry bool

	// Budget limits retries across all calls through one Client.
	Budget Budget
}

// Budget is a retry quota shared by every call through one [Client], in the
// spirit of gRPC retry throttling and the AWS SDKs' retry quota: each retry
// withdraws tokens, each success deposits some back, and when the bucket
// runs dry retries are refused with [ErrBudgetExhausted] until successes
// refill it. A full outage then costs about one attempt per call plus
// Capacity/RetryCost retries in all, instead of MaxAttempts per call. With
// no failures it never refuses. Retries after 409 (a duplicate in flight,
// not an overload) neither need nor spend tokens.
type Budget struct {
	// Disabled turns the budget off: every retry the policy allows is made.
	Disabled bool

	// Capacity is the bucket size and starting fill. 0 means 500.
	Capacity int

	// RetryCost is withdrawn per retry; TimeoutCost per retry after a
	// timeout, which costs the server more. 0 means 5 and 10.
	RetryCost   int
	TimeoutCost int
}

// DefaultPolicy returns the policy a [Client] with a nil Policy uses: 4
// attempts, jittered exponential backoff from 250 ms capped at 20 s,
// Retry-After honoured up to 60 s, keys for POST and PATCH sent bare in
// Idempotency-Key, the retry budget on.
func DefaultPolicy() *Policy {
	return &Policy{}
}

// StripePolicy returns [DefaultPolicy] with Stripe-Should-Retry honoured,
// for APIs that speak Stripe's dialect.
func StripePolicy() *Policy {
	return &Policy{HonorShouldRetry: true}
}

// policy is a Policy with every default filled in, resolved once per
// Client so the request path does no defaulting.
type policy struct {
	maxAttempts   int
	baseDelay     time.Duration
	maxDelay      time.Duration
	maxRetryAfter time.Duration
	keyMethods    []string
	keyHeader     string
	quoteKey      bool
	maxBody       int64
	retention     time.Duration
	shouldRetry   bool
}

func (p *Policy) resolve() policy {
	if p == nil {
		p = &Policy{}
	}
	r := policy{
		maxAttempts:   p.MaxAttempts,
		baseDelay:     p.BaseDelay,
		maxDelay:      p.MaxDelay,
		maxRetryAfter: p.MaxRetryAfter,
		keyMethods:    p.KeyMethods,
		keyHeader:     http.CanonicalHeaderKey(p.KeyHeader),
		quoteKey:      p.QuoteKey,
		maxBody:       p.MaxBodyBytes,
		retention:     p.Retention,
		shouldRetry:   p.HonorShouldRetry,
	}
	if r.maxAttempts == 0 {
		r.maxAttempts = 4
	} else if r.maxAttempts < 0 {
		r.maxAttempts = 1
	}
	if r.baseDelay <= 0 {
		r.baseDelay = 250 * time.Millisecond
	}
	if r.maxDelay <= 0 {
		r.maxDelay = 20 * time.Second
	}
	if r.maxDelay < r.baseDelay {
		r.maxDelay = r.baseDelay
	}
	if r.maxRetryAfter <= 0 {
		r.maxRetryAfter = 60 * time.Second
	}
	if r.keyMethods == nil {
		r.keyMethods = []string{http.MethodPost, http.MethodPatch}
	}
	if r.keyHeader == "" {
		r.keyHeader = DefaultKeyHeader
	}
	if r.maxBody <= 0 {
		r.maxBody = 8 << 20
	}
	if r.retention <= 0 {
		r.retention = 24 * time.Hour
	}
	return r
}

func (p *policy) needsKey(method string) bool {
	for _, m := range p.keyMethods {
		if m == method {
			return true
		}
	}
	return false
}

// idempotentMethod reports whether RFC 9110 §9.2.2 makes repeating method
// harmless, so an outcome-unknown failure may be retried without a key.
func idempotentMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// RetryReason says why an attempt is retried. It appears in [RetryEvent]
// and logs.
type RetryReason string

// The reasons a call is retried.
const (
	ReasonInProgress     RetryReason = "in_progress"     // 409: the first attempt is still running on the server
	ReasonRateLimited    RetryReason = "rate_limited"    // 429
	ReasonUnavailable    RetryReason = "unavailable"     // 503
	ReasonServerError    RetryReason = "server_error"    // 500, 502, 504
	ReasonShouldRetry    RetryReason = "should_retry"    // Stripe-Should-Retry: true
	ReasonNotSent        RetryReason = "not_sent"        // the request never left: refused, DNS, TLS handshake
	ReasonUnknownOutcome RetryReason = "unknown_outcome" // timeout, reset or EOF after sending
)

// verdict is what the policy makes of one attempt's outcome.
type verdict uint8

const (
	vReturn      verdict = iota // hand the response (or the untouched error) to the caller
	vRetry                      // retry, for the given reason
	vMismatch                   // the server refused the key: *KeyMismatchError
	vKeyRequired                // the server wants a key we did not send: ErrKeyRequired
)

// replayedHeaders are the response headers servers use to mark a replay.
var replayedHeaders = [...]string{"Idempotent-Replayed", "Idempotency-Replayed", "Idempotency-Replay"}

// Replayed reports whether the server marked resp as a replay of a stored
// response (Idempotent-Replayed, Idempotency-Replayed or Idempotency-Replay
// set to true) rather than a fresh execution. It is false for a nil resp.
func Replayed(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	for _, h := range replayedHeaders {
		if v := resp.Header.Get(h); v != "" && strings.EqualFold(strings.TrimSpace(v), "true") {
			return true
		}
	}
	return false
}

// classifyStatus applies the wire contract (DESIGN §2) to a response. peek
// returns the first bytes of the body without consuming it; it is called only
// for statuses where the body decides (Stripe's 400 idempotency_error, the
// IETF 400 "key missing").
func (p *policy) classifyStatus(resp *http.Response, keyed, safe bool, peek func() []byte) (verdict, RetryReason) {
	code := resp.StatusCode
	if code < 300 {
		return vReturn, ""
	}
	if keyed && code == http.StatusUnprocessableEntity {
		return vMismatch, ""
	}
	if code == http.StatusBadRequest {
		if keyed && isStripeIdempotencyError(peek()) {
			return vMismatch, ""
		}
		if !keyed && isKeyMissingProblem(peek()) {
			return vKeyRequired, ""
		}
	}
	if Replayed(resp) {
		// A stored failure replays forever; resending cannot change it.
		return vReturn, ""
	}
	if p.shouldRetry {
		switch resp.Header.Get("Stripe-Should-Retry") {
		case "true":
			return vRetry, ReasonShouldRetry
		case "false":
			return vReturn, ""
		}
	}
	switch code {
	case http.StatusConflict:
		if keyed {
			return vRetry, ReasonInProgress
		}
	case http.StatusTooManyRequests:
		// The server refused before doing anything: safe for any method.
		return vRetry, ReasonRateLimited
	case http.StatusServiceUnavailable:
		if safe {
			return vRetry, ReasonUnavailable
		}
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		if safe {
			return vRetry, ReasonServerError
		}
	}
	return vReturn, ""
}

// errClass sorts transport errors by what they say about the server side.
type errClass uint8

const (
	errUnknown   errClass = iota // the request may have reached the server
	errNotSent                   // the request certainly never left
	errPermanent                 // retrying cannot help (bad certificate)
)

// classifyError sorts a transport error with errors.Is/As on typed errors,
// never by its text. What cannot be classified is outcome-unknown.
func classifyError(err error) errClass {
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
	)
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &invalidErr) {
		return errPermanent
	}
	var (
		dnsErr    *net.DNSError
		opErr     *net.OpError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
	)
	switch {
	case errors.As(err, &dnsErr):
		return errNotSent
	case errors.As(err, &opErr) && opErr.Op == "dial":
		// Covers refused, unreachable and dial timeouts: no connection, no request.
		return errNotSent
	case errors.Is(err, syscall.ECONNREFUSED):
		return errNotSent
	case errors.As(err, &recordErr), errors.As(err, &alertErr):
		// The TLS handshake failed, so no request bytes were written.
		return errNotSent
	}
	return errUnknown
}

// isTimeout reports whether err is a timeout, which costs the retry budget
// more because the server may still be working.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// budget is the live token bucket of a Client (see Budget).
type budget struct {
	tokens      atomic.Int64
	capacity    int64
	cost        int64
	timeoutCost int64
}

func newBudget(b Budget) *budget {
	if b.Disabled {
		return nil
	}
	nb := &budget{capacity: int64(b.Capacity), cost: int64(b.RetryCost), timeoutCost: int64(b.TimeoutCost)}
	if nb.capacity <= 0 {
		nb.capacity = 500
	}
	if nb.cost <= 0 {
		nb.cost = 5
	}
	if nb.timeoutCost <= 0 {
		nb.timeoutCost = 10
	}
	nb.tokens.Store(nb.capacity)
	return nb
}

// withdraw takes the cost of one retry, or reports that the bucket cannot
// pay it. A nil budget always pays.
func (b *budget) withdraw(timeout bool) (int64, bool) {
	if b == nil {
		return 0, true
	}
	cost := b.cost
	if timeout {
		cost = b.timeoutCost
	}
	for {
		t := b.tokens.Load()
		if t < cost {
			return 0, false
		}
		if b.tokens.CompareAndSwap(t, t-cost) {
			return cost, true
		}
	}
}

// deposit returns n tokens, never past capacity.
func (b *budget) deposit(n int64) {
	if b == nil || n <= 0 {
		return
	}
	for {
		t := b.tokens.Load()
		if t >= b.capacity {
			return
		}
		nt := min(t+n, b.capacity)
		if b.tokens.CompareAndSwap(t, nt) {
			return
		}
	}
}
