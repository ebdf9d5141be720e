package idemhttp

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
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
	// header override the status rules, except for a 409 that says the
	// key is still in progress, which is always waited out.
	// [StripePolicy] sets it.
	HonorShouldRetry bool

	// InProgressPatience bounds how long one call waits out a 409 "still
	// in progress" (the first request with the same key is running on the
	// server): retries after such a 409 do not count against MaxAttempts,
	// and stop with [ErrInProgress] once the next wait would pass this
	// long after the first 409, or the context's deadline. 0 means 30 s.
	InProgressPatience time.Duration

	// RedactQuery names query parameters, beyond a built-in list of
	// well-known credential names (api_key, access_token, token,
	// signature, X-Amz-Signature, ...), whose values are replaced by
	// "REDACTED" in errors, events and logs. Names match in any letter
	// case. A journaled request whose URL carries one is refused
	// ([ErrInvalidRequest]) rather than written to disk: credentials
	// belong in [Client.PrepareRequest].
	RedactQuery []string

	// RedactPathAfter names path prefixes after which the rest of a URL's
	// path is a secret (a webhook's token: "/services/" for Slack,
	// "/api/webhooks/" for Discord): it is replaced by "REDACTED" in
	// errors, events and logs, as the user part of a URL always is. A
	// journaled request's URL is stored whole, so keep such tokens out of
	// journaled URLs (add them in [Client.PrepareRequest], which may
	// rewrite the URL).
	RedactPathAfter []string

	// KeepResults, with a journal (or WithOperation without one), keeps a
	// copy of a done operation's final response with its entry, when its
	// body is at most this many bytes: status, the headers a caller reads
	// (Content-Type, Content-Encoding, Location, request ids and the like;
	// never Set-Cookie), and the body as the caller read it (decoded when
	// net/http decoded it; as it came, with its Content-Encoding, when the
	// request set Accept-Encoding itself). A rerun of the done operation
	// then gets that response back, marked a replay ([Replayed] is true,
	// Info.FromJournal too), and sends nothing, instead of a [*DoneError]:
	// a charge's id survives a crash between the server's answer and the
	// caller saving it. The body is read before Do returns. 0 keeps none;
	// a journal file holds the copies, so size them with it.
	//
	// No credential rests in a kept copy: the URLs its headers hold
	// (Location, Content-Location, Link, Refresh) lose their user part,
	// fragment and the values of secret query parameters (RedactQuery's
	// names and defaults, which include signed URLs' X-Amz-Signature,
	// X-Amz-Credential and sig) and paths (RedactPathAfter), as in logs. The
	// call that got the response reads it whole; a rerun that replays it
	// reads REDACTED there: a presigned upload URL in a Location must be
	// saved by the first caller, or asked for again.
	KeepResults int64

	// RefetchDone makes a rerun of a done operation whose result was not
	// kept ask the server again, with the same key and body, while the
	// entry is within Retention: the server answers from its stored
	// response and runs nothing. Past the retention the server may have
	// forgotten the key, and the rerun gets a [*DoneError] instead.
	RefetchDone bool

	// AllowUnnamed lets a Client with a Journal send keyed calls without
	// [WithOperation] or [WithKey], which it otherwise refuses with
	// [ErrInvalidRequest] before anything is written or sent. Such a call is protected only by
	// [Client.Resume] after a crash: a rerun of the same work mints a new
	// key (an SDK's own random key is no better) and may run it twice. Set
	// it only for work that is never rerun, or that finds what it already
	// did by other means.
	AllowUnnamed bool

	// RetriedDeleteNotFoundOK reports a 404 to a DELETE as 204 No Content
	// when an earlier attempt of the same call may have run without its
	// answer reaching the client (a timeout or a reset after sending): that
	// attempt most likely deleted the resource. [ResponseInfo] says so
	// either way (UnknownOutcome, and OriginalStatus 404 when rewritten).
	RetriedDeleteNotFoundOK bool

	// Budget limits retries across all calls through one Client.
	Budget Budget

	// Backoff, when set, returns the wait before a call's retry n (1 for
	// the first), instead of the jittered exponential backoff from
	// BaseDelay to MaxDelay: a constant, a linear or a decorrelated
	// jitter, as go-retryablehttp, failsafe-go and the AWS SDKs offer. Its
	// result is bounded as the built-in backoff's is: a negative one
	// means no wait, and one longer than MaxDelay (default 20 s) waits
	// MaxDelay; raise MaxDelay for longer waits. A longer Retry-After
	// still wins (up to MaxRetryAfter), the in-progress patience bounds
	// the waits after a 409, and a wait that would cross the context's
	// deadline stops the call at once instead. It must be safe for
	// concurrent use.
	Backoff func(retry int) time.Duration

	// Pacer, when set, paces every attempt of every call through the
	// Client, the first ones included: Wait before it (it returns nil when
	// the attempt may go; an error stops the call before the attempt is
	// sent, with the context's error when the context ended and
	// [ErrPacerRefused] otherwise, so a Pacer is never bypassed),
	// Observe after each attempt that was sent, with its status
	// (0 for a transport error) and whether the server throttled it (a
	// 429, or a 503 with Retry-After). The adaptive package's Rate slows
	// a batch to the rate a throttling server accepts, as the AWS SDKs'
	// adaptive retry mode does. nil paces nothing.
	Pacer Pacer

	// Classify, when set, sees every attempt's outcome (a response, with
	// a nil error, or an error, with a nil response) before the built-in
	// rules, for an API with its own retry dialect, such as a body field
	// "retryable" (read it with [PeekBody]). It returns a [Verdict]:
	// [VerdictDefault] leaves the decision to the built-in rules.
	//
	// Precedence, first match wins:
	//  1. a retry body that differs from the first attempt's
	//     ([ErrBodyChanged]) and the call's context ending always stop
	//     the call; a response that comes with an error (a refused
	//     redirect) is returned; Classify is not consulted for them;
	//  2. Classify's verdict, where it applies (see each Verdict: an
	//     unknown outcome of a request with neither a key nor an
	//     idempotent method is retried only on [VerdictRetryUnsafe],
	//     which may run the operation twice);
	//  3. the built-in rules: HonorShouldRetry, then the wire contract.
	// A retry Classify asks for is still bounded by MaxAttempts, the
	// budget, MaxRetryAfter and the deadline, and is reported with
	// [idemtrace.ReasonClassified]. Classify runs on the calling goroutine and must
	// not close or consume the body. It must be safe for concurrent use.
	Classify func(resp *http.Response, err error) Verdict
}

// Pacer paces a Client's attempts. See [Policy.Pacer].
type Pacer interface {
	Wait(ctx context.Context) error
	Observe(status int, throttled bool)
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
// Client so the request path does no defaulting. Its slices are copies.
type policy struct {
	maxAttempts        int
	baseDelay          time.Duration
	maxDelay           time.Duration
	maxRetryAfter      time.Duration
	keyMethods         []string
	keyHeader          string
	quoteKey           bool
	maxBody            int64
	retention          time.Duration
	shouldRetry        bool
	inProgressPatience time.Duration
	redactQuery        []string // lower case, defaults included
	redactPath         []string
	keepResults        int64
	refetchDone        bool
	allowUnnamed       bool
	deleteGoneOK       bool
	classify           func(*http.Response, error) Verdict
	backoffFn          func(int) time.Duration
	pacer              Pacer
}

func (p *Policy) resolve() policy {
	if p == nil {
		p = &Policy{}
	}
	r := policy{
		maxAttempts:        p.MaxAttempts,
		baseDelay:          positiveOr(p.BaseDelay, 250*time.Millisecond),
		maxDelay:           positiveOr(p.MaxDelay, 20*time.Second),
		maxRetryAfter:      positiveOr(p.MaxRetryAfter, 60*time.Second),
		keyMethods:         slices.Clone(p.KeyMethods),
		keyHeader:          cmp.Or(http.CanonicalHeaderKey(p.KeyHeader), DefaultKeyHeader),
		quoteKey:           p.QuoteKey,
		maxBody:            positiveOr(p.MaxBodyBytes, 8<<20),
		retention:          positiveOr(p.Retention, 24*time.Hour),
		shouldRetry:        p.HonorShouldRetry,
		inProgressPatience: positiveOr(p.InProgressPatience, 30*time.Second),
		deleteGoneOK:       p.RetriedDeleteNotFoundOK,
		redactQuery:        contract.SecretQueryNames(p.RedactQuery),
		redactPath:         slices.Clone(p.RedactPathAfter),
		keepResults:        max(p.KeepResults, 0),
		refetchDone:        p.RefetchDone,
		allowUnnamed:       p.AllowUnnamed,
		classify:           p.Classify,
		backoffFn:          p.Backoff,
		pacer:              p.Pacer,
	}
	if p.KeyMethods != nil && r.keyMethods == nil {
		r.keyMethods = []string{} // empty but non-nil: no method gets a key
	}
	if r.maxAttempts == 0 {
		r.maxAttempts = 4
	} else if r.maxAttempts < 0 {
		r.maxAttempts = 1
	}
	r.maxDelay = max(r.maxDelay, r.baseDelay)
	if r.keyMethods == nil {
		r.keyMethods = []string{http.MethodPost, http.MethodPatch}
	}
	return r
}

// positiveOr is v, or def when v is not positive: a field's default.
func positiveOr[T int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
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

// verdict is what the policy makes of one attempt's outcome.
type verdict uint8

const (
	vReturn      verdict = iota // hand the response (or the untouched error) to the caller
	vRetry                      // retry, for the given reason
	vInProgress                 // 409: the first request with the key still runs; wait it out
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
// for statuses where the body decides (409, 422, and the two 400s: Stripe's
// idempotency_error and the IETF "key missing"). See signal.go for how an
// idempotency signal is told from an application's own status.
func (p *policy) classifyStatus(resp *http.Response, sig signals, peek func() []byte) (verdict, idemtrace.RetryReason) {
	code := resp.StatusCode
	if code < 300 {
		return vReturn, ""
	}
	if Replayed(resp) {
		// A stored failure replays forever; resending cannot change it.
		return vReturn, ""
	}
	switch code {
	case http.StatusConflict:
		if sig.keyed && inProgress(resp, sig, peek) {
			return vInProgress, idemtrace.ReasonInProgress
		}
	case http.StatusUnprocessableEntity:
		// Key reuse, as deployed servers answer it: a body naming
		// idempotency, or a bare 422 (an HTML error page, plain text,
		// nothing) to a key that may have been used before. A structured
		// body about something else is the application's validation.
		if sig.keyed && !sig.fresh && bodyEvidence(peek()) != evOther {
			return vMismatch, ""
		}
	case http.StatusBadRequest:
		if sig.keyed && !sig.fresh && isStripeIdempotencyError(peek()) {
			return vMismatch, ""
		}
		if !sig.keyed && isKeyMissingProblem(peek()) {
			return vKeyRequired, ""
		}
	}
	if p.shouldRetry {
		switch resp.Header.Get("Stripe-Should-Retry") {
		case "true":
			return vRetry, idemtrace.ReasonShouldRetry
		case "false":
			return vReturn, ""
		}
	}
	switch code {
	case http.StatusTooManyRequests:
		// The server refused before doing anything: safe for any method.
		return vRetry, idemtrace.ReasonRateLimited
	case http.StatusServiceUnavailable:
		if sig.safe {
			return vRetry, idemtrace.ReasonUnavailable
		}
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout:
		if sig.safe {
			return vRetry, idemtrace.ReasonServerError
		}
	}
	return vReturn, ""
}

// errClass sorts failed attempts by what they say about the server side.
type errClass uint8

const (
	errUnknown   errClass = iota // the request may have reached the server
	errNotSent                   // the request certainly never left
	errPermanent                 // retrying cannot help
)

// errClassNames are the exported names of the classes, for hooks.
var errClassNames = [...]idemtrace.ErrorClass{errUnknown: idemtrace.ClassUnknown, errNotSent: idemtrace.ClassNotSent, errPermanent: idemtrace.ClassPermanent}

// isCertError reports a certificate the client refused: retrying cannot
// make it acceptable.
func isCertError(err error) bool {
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
	)
	return errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &invalidErr)
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
	nb := &budget{capacity: positiveOr(int64(b.Capacity), 500), cost: positiveOr(int64(b.RetryCost), 5), timeoutCost: positiveOr(int64(b.TimeoutCost), 10)}
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

// costOf returns what a retry costs, after a timeout or not.
func (b *budget) costOf(timeout bool) int64 {
	if timeout {
		return b.timeoutCost
	}
	return b.cost
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
