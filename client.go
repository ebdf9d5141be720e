package idemhttp

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/plant"
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
	//
	// Name each operation with [WithOperation] (or give its key with
	// [WithKey]): a keyed call with neither is refused ([ErrInvalidRequest],
	// before anything is written or sent), since only Resume at start-up
	// would protect it: a rerun of the same work after a crash would mint
	// a new key (a key in the header may be an SDK's, minted per call) and
	// may run it twice. [Policy.AllowUnnamed] lets such calls through.
	Journal Journal

	// Logger receives one Info record per retry (method, redacted URL,
	// key, attempt, delay, reason). Bodies, header values and the values
	// of secret query parameters ([Policy.RedactQuery]) are never logged,
	// nor is the idempotency key itself unless LogKeys: a record names it
	// by its digest, key_digest ([KeyDigest]), the same the server's logs
	// carry. nil means silent.
	Logger *slog.Logger

	// LogKeys puts the idempotency key itself in Logger's records (key,
	// beside key_digest). A key names an operation whose stored response
	// a server replays to whoever sends it with the caller's credentials:
	// keep it out of logs that others read. Hooks receive the key either
	// way (they are the caller's own code).
	LogKeys bool

	// Hooks, when set, are called at each decision of every call:
	// attempts, retries, give-ups, budget refusals, journal writes. See
	// [idemtrace.Hooks]. nil costs nothing.
	Hooks *idemtrace.Hooks

	// PrepareRequest, when set, is called on every outgoing request after
	// its journal entry is written and before the first attempt, in Do and
	// in Resume. Add credentials here: whatever it sets never reaches the
	// journal, and never follows a redirect to another host. It gets the
	// client's own copies of the request's URL and Header (never nil), so
	// it may change them freely, but for the key header, which the client
	// sets: one that changes or deletes it stops the call
	// ([ErrInvalidRequest]). The caller's request is not modified. An
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

	// onPhase, when set (by tests only, before the first call), sees every
	// move of every call's lifecycle.
	onPhase func(from, to phase)

	once sync.Once
	cfg  config
}

// config is a Client's configuration, read once by init: the request path
// never reads the exported fields, so a caller who changes them later
// neither races with it nor changes what it does.
type config struct {
	pol     policy
	hc      *http.Client     // what the engine sends each attempt with
	at      attemptTransport // hc's Transport, which a first attempt goes to directly (send.go)
	budget  *budget
	mem     *memJournal
	journal Journal
	logger  *slog.Logger
	logKeys bool            // Client.LogKeys
	hooks   idemtrace.Hooks // a copy of *Client.Hooks; every field nil when unset
	prepare func(*http.Request) error
	secrets []string         // canonical names of the caller's secret headers
	now     func() time.Time // Client.clock, or time.Now
	// inflight counts the calls in Do, for Stats.
	inflight atomic.Int64
	// keyToken: the key header's name is a token (net/http sends it).
	keyToken bool
	// engineFirst: the first attempt goes through go-retryablehttp's
	// engine too, as every attempt did before send.go; set only by
	// TestFirstAttemptMatchesEngine, which compares the two.
	engineFirst bool
	// traceable: the Transport is net/http's, which reports httptrace
	// events, so an attempt that never obtained a connection failed
	// before anything could be sent (see wire.go); h2c: it may speak
	// HTTP/2 over a connection without TLS.
	traceable, h2c bool
	// scope is the scope of the senders' slots of calls with c.Journal
	// (lifecycle.go): the journal itself, reached through the caller's
	// wrappers (Unwrap), so that Clients sharing it share its slots, or
	// the config, a scope of this Client's own, for a journal whose value
	// cannot be a map key. jid and memID are what the client knows of
	// c.Journal and of mem (journal_identity.go).
	scope      any
	jid, memID journalIdentity
	// onPhase, for tests, sees every move of every call's lifecycle.
	onPhase func(from, to phase)
}

// init resolves the configuration once.
func (c *Client) init() {
	c.once.Do(func() {
		cfg := &c.cfg
		cfg.pol = c.Policy.resolve()
		cfg.keyToken = isToken(cfg.pol.keyHeader)
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
		if t, ok := rt.(*http.Transport); ok {
			cfg.traceable = true
			cfg.h2c = t.Protocols != nil && t.Protocols.UnencryptedHTTP2()
		}
		// The engine's client has no Timeout: net/http enforces one on a
		// RoundTripper it does not know (ours) with a goroutine and a
		// timer per request. attemptTransport applies it instead. Nor has
		// it a Jar: net/http's adds the jar's cookies to the request's own
		// header, which the engine sends on every attempt, so attempt three
		// carried them three times; attemptTransport adds them to each
		// attempt's copy.
		cfg.at = attemptTransport{rt: rt, timeout: base.Timeout, jar: base.Jar}
		cfg.hc = &http.Client{
			Transport:     cfg.at,
			CheckRedirect: checkRedirect(base.CheckRedirect),
		}
		cfg.mem = newMemJournal(cfg.pol.retention)
		cfg.journal = c.Journal
		cfg.resolveJournals(c.Journal) // journal_identity.go
		cfg.logger, cfg.logKeys = c.Logger, c.LogKeys
		if hooksSet(c.Hooks) {
			cfg.hooks = *c.Hooks
		}
		cfg.prepare = c.PrepareRequest
		cfg.onPhase = c.onPhase
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
	jar     http.CookieJar
}

func (t attemptTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.roundTripFor(attemptFrom(r.Context()), r)
}

// roundTripFor is RoundTrip of an attempt of a (nil: a request of no
// call), which send knows without looking it up in r's context.
func (t attemptTransport) roundTripFor(a *operation, r *http.Request) (*http.Response, error) {
	if a != nil {
		if resp := a.replay; resp != nil {
			// The response send already has for r: http.Client follows
			// its redirect from there (send.go).
			a.replay = nil
			return resp, nil
		}
		if err := a.handOver(r); err != nil {
			closeBody(r) // a RoundTripper closes the body, even on errors
			return nil, err
		}
	}
	if t.jar != nil {
		// As http.Client does for each request it sends, redirect hops
		// included, but on a copy: the engine reuses r's header for
		// every attempt, and the caller's header is the caller's.
		if cookies := t.jar.Cookies(r.URL); len(cookies) > 0 {
			r2 := *r
			r2.Header = r.Header.Clone()
			for _, ck := range cookies {
				r2.AddCookie(ck)
			}
			r = &r2
		}
	}
	var resp *http.Response
	var err error
	if t.timeout <= 0 {
		resp, err = t.rt.RoundTrip(r)
	} else {
		resp, err = t.roundTrip(r)
	}
	if err == nil && resp != nil && resp.StatusCode >= 300 && resp.StatusCode < 400 { // nil: send and http.Client say what is wrong
		hideUnparsableLocation(r, resp)
	}
	if a != nil && err == nil {
		a.lastResp = resp // for unwind: a panic before the call returns it leaves it open
	}
	if err == nil && resp != nil && t.jar != nil { // nil: send and http.Client say what is wrong
		if rc := resp.Cookies(); len(rc) > 0 {
			t.jar.SetCookies(r.URL, rc)
		}
	}
	return resp, err
}

// hideUnparsableLocation removes from a redirect a Location that
// net/http's Client could not parse. Left in, the Client fails the call
// with "failed to parse Location header %q", quoting the value whole (a
// signed URL's signature with it) into the error, every retry's log line
// and the hooks, and the attempt reads as one that got no answer. Without
// it the Client returns the 3xx itself, as it does for any redirect
// without a Location (net/http issues 17773, 49281): an answer that
// nothing ran at a target, so the operation stays pending (outcome). The
// caller loses only a header it could not have followed.
//
//go:noinline
func hideUnparsableLocation(r *http.Request, resp *http.Response) {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
	default:
		return
	}
	loc := resp.Header.Get("Location")
	if loc == "" {
		return
	}
	if _, err := r.URL.Parse(loc); err != nil {
		resp.Header.Del("Location")
	}
}

// roundTrip is the RoundTrip of an attempt bounded by t.timeout (> 0).
//
//go:noinline
func (t attemptTransport) roundTrip(r *http.Request) (*http.Response, error) {
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
// req itself is not modified; its Body is closed, as net/http does. Two
// calls of one operation (the same WithOperation id, or the same key) in
// one process never send at once: the second waits for the first and
// then sees its outcome.
//
// As with [http.Client.Do], a non-2xx response that is not retried (or
// whose retries are over and that the contract returns as is, such as a
// 404, an application's own 409 or 422, or a replayed failure) comes back
// as a response with a nil error, and the caller must close its Body. Every
// other outcome comes back as an error with a nil response, never both:
//   - before sending: errors wrapping [ErrInvalidRequest], [ErrInvalidKey],
//     [ErrKeyConflict], [ErrNotReplayable], [ErrKeyExpired], [ErrClockJump],
//     a local [*KeyMismatchError], or a [*DoneError] for an operation the
//     journal has done (nothing is sent: done is done; with
//     [Policy.KeepResults] the kept result comes back instead, as a
//     replay);
//   - from the server: [*KeyMismatchError], or a [*GiveUpError] whose
//     reason is [ErrExhausted], [ErrInProgress], [ErrBudgetExhausted],
//     [ErrRetryAfterTooLong], [ErrKeyRequired], [ErrBodyChanged],
//     [ErrNotReplayable] (GetBody failed on a retry), [ErrPacerRefused]
//     or the context's error;
//   - a transport error that must not be retried, as net/http returned it
//     but with the URL's secrets redacted: an outcome-unknown failure of a
//     request without a key and with a non-idempotent method, a
//     certificate error, a request net/http refused before connecting (an
//     invalid header, an unsupported scheme), or a CheckRedirect refusal.
//
// An error matches [ErrNotSent] when the call provably sent nothing the
// server could act on and left no journal entry behind: only then is it
// safe to try the operation again under a new key. One that matches
// [ErrFenced] sent nothing itself, but the journal would not let it
// withdraw its entry: another sender (a worker of a fleet sharing the
// journal) finished or holds it, and may have sent it; never try it again
// under a new key.
//
// Redirects: a keyed request, or one whose headers came partly from
// PrepareRequest or name a secret header, is not followed to another
// origin (scheme and host): the 3xx response is returned instead, so the
// key, the body and credentials never reach a host the caller did not
// name. Any 3xx that comes back, whoever left it unfollowed (these rules,
// the HTTPClient's CheckRedirect, [http.ErrUseLastResponse]), leaves the
// journal entry pending, since nothing ran at the target.
// A redirect that changes the method (303, or 301/302 after POST) drops
// the key header.
func (c *Client) Do(req *http.Request) (*http.Response, error) { return c.do(req, nil, false) }

// do is the one path of every request: Do, the StandardClient's transport
// (sdk: a final give-up's last response goes back to the SDK) and Resume
// (resend: the journal entry it resends).
func (c *Client) do(req *http.Request, rs *resend, sdk bool) (*http.Response, error) {
	if req == nil {
		return nil, &notSentError{fmt.Errorf("idemhttp: %w: nil request", ErrInvalidRequest)}
	}
	if req.URL == nil {
		closeBody(req)
		return nil, &notSentError{fmt.Errorf("idemhttp: %w: nil URL", ErrInvalidRequest)}
	}
	c.init()
	cfg := &c.cfg
	cfg.inflight.Add(1)
	defer cfg.inflight.Add(-1)
	// The call begins: the checks before anything is written or sent, the
	// key's source, the journal, the body made replayable; then the call
	// state, which runs the rest (proceed). The returns are few, so that
	// the defer is open-coded.
	p := &cfg.pol
	ctx := req.Context()
	op, hasOp := operationFromContext(ctx)
	// A call that will send a key without PrepareRequest gets its header
	// copied in the same pass that looks for the caller's key.
	needs := hasOp || p.needsKey(req.Method)
	key, explicit, hc, err := callerKey(ctx, req.Header, p.keyHeader, cfg.prepare == nil && needs)
	keyed := key != "" || needs
	var j Journal
	var scope any = cfg // the slots of a call without c.Journal are this Client's
	if err == nil {
		if err = ctx.Err(); err != nil {
			err = unsent(err, key, hasOp) // nothing sent, nothing journaled
		} else if keyed && (hasOp || cfg.journal != nil) {
			j, scope, err = c.journalOf(op, hasOp, key, explicit, rs)
		}
	}
	if err != nil {
		closeBody(req)
		return nil, err
	}
	a := &operation{c: c, cfg: cfg, p: p.apply(ctx), operation: op, keyed: keyed, safe: keyed || idempotentMethod(req.Method), j: j, scope: scope, sdk: sdk}
	a.mem, a.getBody, err = replayableBody(req, j != nil, p.maxBody, &a.catcher)
	if err != nil {
		return nil, unsent(err, key, hasOp)
	}
	if plant.GetBodyRewind && req.GetBody != nil { // a planted bug (internal/plant)
		plantGetBodies.Store(a, req.GetBody)
	}
	a.req = req // for the call's events until out replaces it
	a.cctx = callCtx{Context: ctx, a: a}
	a.hc = hc
	return a.proceed(ctx, req, key, explicit, rs)
}

// unsent is a refusal before anything is sent: ErrNotSent only when no
// earlier call can have used the operation's key, the call bringing no
// key and naming no operation of its own.
//
//go:noinline
func unsent(err error, key string, hasOp bool) error {
	if key == "" && !hasOp {
		return &notSentError{err}
	}
	return err
}

// journalOf returns the journal of a keyed call that names an operation
// or whose Client has a Journal, and the scope of its slots; or the
// refusal of an operation id that is not valid, or of a journaled call
// without a name.
//
//go:noinline
func (c *Client) journalOf(op string, hasOp bool, key string, explicit bool, rs *resend) (Journal, any, error) {
	cfg, p := &c.cfg, &c.cfg.pol
	if hasOp {
		if err := contract.ValidateOperation(op); err != nil {
			return nil, nil, err
		}
	}
	j, scope := cfg.journal, cfg.scope
	if j == nil {
		j, scope = cfg.mem, cfg // an operation without c.Journal: this Client's slots
	}
	if cfg.journal != nil && !hasOp && !explicit && rs == nil && !p.allowUnnamed {
		// Fail closed by default: a rerun of the same work would mint
		// a new key (a key in the header may be an SDK's, minted per
		// call). WithKey names the operation by a key of the caller's
		// own; Resume's resends name what the journal holds.
		return nil, nil, unsent(fmt.Errorf("idemhttp: %w: a call journaled without an operation id: name it with WithOperation(ctx, id) "+
			"(or give its key with WithKey), so that a rerun of the same work reuses its key; or set Policy.AllowUnnamed", ErrInvalidRequest), key, hasOp)
	}
	return j, scope, nil
}

// proceed runs a call from its key on: the journal entry, the outgoing
// request, its attempts, the outcome. key is the caller's, "" if none.
// What do made of the request is in a: its body, made replayable (mem, or
// getBody for a streamed one), and a checked copy of its header, if one
// was made (hc, by callerKey).
func (a *operation) proceed(ctx context.Context, req *http.Request, key string, explicit bool, rs *resend) (*http.Response, error) {
	cfg, p, keyed := a.cfg, &a.cfg.pol, a.keyed
	if a.getBody != nil {
		a.openBody = req // a body left open to stream, until sent or closed
	}
	// A panic anywhere in the call (a hook's, a caller's callback's, a
	// journal's) ends it as any call ends: the slots freed, an entry it
	// created and never sent withdrawn, a streamed body closed. The panic
	// goes on.
	defer a.exit(ctx)
	if keyed {
		if resp, err, ok := a.open(ctx, req, key, explicit, a.mem.b, rs); !ok {
			a.closeStreamed()
			return resp, err
		}
	} else {
		a.advance(phaseAttempting)
	}
	key = a.key

	out := req.WithContext(a.context(a.callStart(ctx)))
	a.req = out
	// The header is checked as net/http would (unsendable) after
	// PrepareRequest, or as it is copied (cloneChecked): the key header
	// added is a token with a valid key.
	var err error
	checked, why := false, ""
	if cfg.prepare != nil {
		err = a.prepareOut(req, out)
	} else if keyed {
		hc := a.hc
		if hc.h == nil { // a key in the header of a request that needs none
			hc = cloneChecked(req.Header, p.keyHeader)
		}
		out.Header, why, checked = hc.h, hc.why, true
		if !cfg.keyToken {
			why = cmp.Or(why, badField(p.keyHeader, nil))
		}
		a.keyVal[0] = contract.FormatKeyHeader(key, p.quoteKey)
		out.Header[p.keyHeader] = a.keyVal[:]
	}
	if err == nil {
		if why := unsendable(out, checked, why); why != "" {
			err = errUnsendable(why)
		}
	}
	if err != nil {
		return a.refuse(ctx, err)
	}

	// The first attempt's body, and GetBody for net/http's own resends and
	// redirects (and, on a retry, the engine's, which rewinds it the same
	// way: operation.rewind).
	out.Body = nil
	if n := a.mem.len(); n > 0 {
		a.bodyLen = int64(n)
		out.Body, out.GetBody, out.ContentLength = a.firstMemBody(), a.rewind, a.bodyLen
	} else if a.getBody != nil {
		a.streamFirst(ctx, req, out, a.getBody)
	}
	resp, err := a.run(out)
	if err != nil {
		resp, err = a.finish(resp, err)
	}
	return a.settle(ctx, resp, err)
}

// refuse ends a call that will not send: err says why.
//
//go:noinline
func (a *operation) refuse(ctx context.Context, err error) (*http.Response, error) {
	a.closeStreamed()
	return a.settle(ctx, nil, err)
}

// firstMemBody is the first attempt's body, of a body in memory.
//
//go:noinline
func (a *operation) firstMemBody() io.ReadCloser {
	// memBody's first use, with the reader's type known here.
	a.memUsed = true
	if a.mem.str {
		a.strReader.Reset(a.mem.s)
		return io.NopCloser(&a.strReader)
	}
	a.memReader.Reset(a.mem.b)
	return io.NopCloser(&a.memReader)
}

// prepareOut gives out, the outgoing request, a header and URL of its own
// and the key header, and runs PrepareRequest on it: what proceed does
// for a Client with PrepareRequest. The error is the call's.
//
//go:noinline
func (a *operation) prepareOut(req, out *http.Request) error {
	cfg, p := a.cfg, &a.cfg.pol
	out.Header = cloneWithoutFold(req.Header, p.keyHeader, true)
	u := *req.URL
	out.URL = &u
	if a.keyed {
		a.keyVal[0] = contract.FormatKeyHeader(a.key, p.quoteKey)
		out.Header[p.keyHeader] = a.keyVal[:]
	}
	if err := cfg.prepare(out); err != nil {
		return fmt.Errorf("idemhttp: prepare request: %w", err)
	}
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	if a.keyed && !keyHeaderIs(out.Header, p.keyHeader, a.keyVal[0]) {
		// The key is the journal's and the call's, not the callback's:
		// sent under another (or none), a resend under the journaled
		// key would be a second operation to the server.
		return fmt.Errorf("idemhttp: %w: PrepareRequest changed the %s header; the client sets it", ErrInvalidRequest, p.keyHeader)
	}
	return nil
}

// errUnsendable is the error of a request net/http would not send.
//
//go:noinline
func errUnsendable(why string) error {
	return fmt.Errorf("idemhttp: %w: net/http would not send it: %s", ErrInvalidRequest, why)
}

// streamFirst makes out's body the first pass over the caller's streamed
// body (req.Body), with GetBody for the passes after it.
//
//go:noinline
func (a *operation) streamFirst(ctx context.Context, req, out *http.Request, getBody func() (io.ReadCloser, error)) {
	st := &streamed{getBody: getBody}
	st.first.reset(ctx, req.Body, &st.ref, req.ContentLength, false)
	a.stream, a.bodyLen = st, req.ContentLength
	out.Body, out.GetBody = &st.first, a.rewind
}

// closeStreamed closes a body left open to stream (an in-memory one is
// closed already) when the call stops before sending it.
func (a *operation) closeStreamed() {
	if r := a.openBody; r != nil {
		a.openBody = nil
		closeBody(r)
	}
}

// exit is proceed's deferred end: nothing to do for a call that settled
// and returned its response; a panic's leftovers otherwise (exitSlow).
func (a *operation) exit(ctx context.Context) {
	if r := a.lastResp; a.settled && (r == nil || r.Body == nil || a.returned) {
		return
	}
	a.exitSlow(ctx)
}

// exitSlow is exit for a call that a panic is leaving (or whose last
// response is not returned): unwind, after a streamed body is closed.
//
//go:noinline
func (a *operation) exitSlow(ctx context.Context) {
	defer a.unwind(ctx)
	if a.settled || a.openBody == nil {
		return // a call that ended: its body is closed or the transport's
	}
	// A panic (OnCallStart, PrepareRequest, OnAttempt, Pacer.Wait): a
	// streamed body is still the call's, or the transport's if it had
	// it, and net/http closes a request's body on every path: close it
	// unless the transport did, so that a caller streaming through an
	// io.Pipe has its writer freed.
	if st := a.stream; st != nil {
		st.first.closeIfOpen()
		if st.last != nil {
			st.last.closeIfOpen() // a later attempt's, made before its hooks ran
		}
		return
	}
	a.closeStreamed()
}

// StandardClient returns an [http.Client] that sends every request
// through c, so any SDK that accepts an *http.Client gets keys and safe
// retries. A key the SDK sets itself (stripe-go sets Idempotency-Key) is
// kept, not replaced, except under [WithOperation] with a journal, where
// the journal's key for the operation wins.
//
// It follows no redirect itself: c follows those its rules allow, and a
// 3xx it returns (to another origin, say) comes back to the SDK as the
// response, never followed by net/http behind c's back. A call that gives
// up on a final status (retries exhausted on 503, a 409 in progress that
// never cleared, a key mismatch) hands the SDK that last response, whole,
// so that the SDK parses its own error body; [ResponseInfo] of it reports
// the client's typed error in Info.Err. Other errors reach the SDK wrapped
// in [*url.Error]; errors.Is and errors.As still see the typed errors of
// [Client.Do]. That outermost *url.Error is net/http's Client's own, built
// from the request's URL as the SDK made it (user name and query
// included): the client redacts every error it makes, but not that one,
// so keep credentials out of URLs (add them in [Client.PrepareRequest]).
// Its CloseIdleConnections does nothing (the pool is c.HTTPClient's); its
// Transport is the [http.RoundTripper] to hand a library that wants one.
//
// Turn the SDK's own retries off. An SDK that retries by itself
// multiplies attempts (when connections die, stripe-go's default of 2
// network retries on top of the Policy's 4 attempts is up to 12 requests
// per call) and its retries
// bypass the retry budget, the deadline rules and the in-progress
// patience. With stripe-go:
//
//	stripe.NewBackendsWithConfig(&stripe.BackendConfig{
//		HTTPClient:        c.StandardClient(),
//		MaxNetworkRetries: stripe.Int64(0), // idemhttp retries
//	})
func (c *Client) StandardClient() *http.Client {
	return &http.Client{
		Transport: roundTripper{c},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // c applied the redirect rules
		},
	}
}

type roundTripper struct{ c *Client }

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.c.do(req, nil, true)
}
