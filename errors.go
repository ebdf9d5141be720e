package idemhttp

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	neturl "net/url"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
)

// Sentinel errors. Each says why a call stopped; test for them with
// [errors.Is]. The typed errors [*GiveUpError] and [*KeyMismatchError] carry
// the facts and unwrap to one of these.
var (
	// ErrInvalidRequest: the request cannot be sent as given (nil request,
	// nil URL, a bad operation id). Returned before anything is sent.
	ErrInvalidRequest = contract.ErrInvalidRequest

	// ErrInvalidKey: a caller-supplied key (or DeriveKey's input) breaks the
	// key rules of [ValidateKey]. Returned before anything is sent.
	ErrInvalidKey = contract.ErrInvalidKey

	// ErrKeyConflict: the request's key header and [WithKey] name different
	// keys. Returned before anything is sent.
	ErrKeyConflict = errors.New("conflicting idempotency keys")

	// ErrNotReplayable: the body has no GetBody and is larger than
	// [Policy.MaxBodyBytes], so a retry could not resend it byte for byte.
	// Returned before anything is sent.
	ErrNotReplayable = errors.New("request body cannot be replayed")

	// ErrKeyMismatch: the key was already used with a different request
	// (IETF 422, or Stripe's 400 idempotency_error), or, with a journal or
	// WithOperation, the same operation was started with another body. Never
	// retried: it is a bug in the caller, and a retry cannot fix it.
	ErrKeyMismatch = errors.New("idempotency key reused with a different request")

	// ErrKeyRequired: the server answered 400 because the request carried no
	// idempotency key (IETF draft): add the method to [Policy.KeyMethods].
	ErrKeyRequired = errors.New("server requires an idempotency key")

	// ErrInProgress: the server kept answering 409 because a request with the
	// same key was still being processed, past [Policy.InProgressPatience]
	// or the context's deadline. The operation may yet complete: resend
	// later with the same key.
	ErrInProgress = errors.New("request with this key still in progress")

	// ErrBodyChanged: GetBody returned, for a retry, other bytes than the
	// body already sent under the key. The changed body was never
	// completely sent (its last byte is held back until it is checked), and
	// the call stopped: a key vouches for one request, and a server that
	// compares bodies would refuse it, one that does not would act on it.
	ErrBodyChanged = errors.New("request body changed between attempts")

	// ErrExhausted: every attempt the policy allows failed.
	ErrExhausted = errors.New("retries exhausted")

	// ErrBudgetExhausted: the client's retry budget refused a retry, because
	// recent attempts through the same client mostly failed (an outage
	// should not be multiplied by retries).
	ErrBudgetExhausted = errors.New("retry budget exhausted")

	// ErrPacerRefused: the Policy's [Pacer] refused an attempt: its Wait
	// returned an error while the call's context was live, as
	// golang.org/x/time/rate's Limiter.Wait does when the token would come
	// after the deadline. The attempt was not sent, and the call stopped:
	// a Pacer is never bypassed. [GiveUpError.Err] holds Wait's error.
	ErrPacerRefused = errors.New("pacer refused the attempt")

	// ErrRetryAfterTooLong: the server asked for a wait (Retry-After) longer
	// than [Policy.MaxRetryAfter] or past the context deadline; the client
	// stopped at once instead of sleeping. [GiveUpError.RetryAfter] holds the
	// server's delay.
	ErrRetryAfterTooLong = errors.New("server asked to wait too long")

	// ErrParked: the server asked the client to come back later
	// (Retry-After) than the client would wait ([Policy.MaxRetryAfter], or
	// the context's deadline), and the operation is journaled: it is kept
	// pending with the server's time as its not-before ([Entry.NotBefore]),
	// durably, and sent again, under its key, only from then on, by
	// [Client.Resume], `idemctl resume` or a rerun. Before then those
	// refuse it with this error and send nothing. A [*ParkedError] carries
	// the time. Its give-up also matches [ErrRetryAfterTooLong].
	ErrParked = errors.New("operation parked until the time the server asked for")

	// ErrKeyExpired: a journaled operation is older than the server's key
	// retention ([Policy.Retention]); resending it could run it twice, so it
	// was not resent. Decide by reconciling with the server.
	ErrKeyExpired = errors.New("idempotency key older than the server's retention")

	// ErrAlreadyDone: the operation named with [WithOperation] is done in
	// the journal (it got a definite outcome in an earlier call or run), so
	// the call sent nothing. A [*DoneError] carries its key and status.
	ErrAlreadyDone = errors.New("operation already done")

	// ErrClockJump: a journaled entry was created, or last updated, after
	// the clock's current time, or the clock is below the latest time a
	// journal with HighWater ever recorded: the clock was set back (or was
	// ahead when the entry was written). Its age, and so whether the server
	// still holds its key, cannot be known, so it is not resent; the entry
	// stays pending for a person or a reconciliation step. Do not just wait
	// for the clock to catch up: past the mark, its age is judged short by
	// the jump, and one near the retention may be resent too late.
	ErrClockJump = errors.New("journal entry is newer than the clock: the clock jumped")

	// ErrNotSent: the call sent nothing the server could act on, on any
	// attempt, and left no journal entry that Client.Resume would send: a
	// refusal before sending, a PrepareRequest error, or attempts that all
	// failed with positive evidence that nothing left (refused connections,
	// DNS failures, failed TLS handshakes, a request net/http refused
	// locally; see docs/lifecycle.md). Only then is trying the operation
	// again under a new key safe. Errors of calls that may have sent do
	// not match it, whatever their cause; nor do those of calls through
	// a journal the client does not know to be one process's (a caller's
	// own, or one behind a wrapper without Unwrap: see [Journal]), which
	// keep their entry pending, since a sender the client cannot see may
	// be using the key; nor do refusals about an
	// operation that an earlier call may have run ([ErrAlreadyDone],
	// [ErrKeyExpired], [ErrClockJump], [ErrKeyConflict], a journal's own
	// failure).
	ErrNotSent = errors.New("request not sent")

	// ErrNotFound: the journal has no entry for that key or operation.
	ErrNotFound = errors.New("journal entry not found")

	// ErrFenced: a journal refused a write to an entry that is no longer
	// the writer's to change: it is done or abandoned (final), or another
	// process's live lease holds it. Nothing changed; whoever finished or
	// holds the entry decides its outcome.
	ErrFenced = errors.New("journal entry finished or held by another sender")
)

// snippetLen bounds how much of a response body a [*KeyMismatchError]
// keeps (its message shows it).
const snippetLen = 512

// errorBodyLen bounds how much of the last response's body a
// [*GiveUpError] keeps: enough for any API's error document, and no more
// than the client reads anyway to reuse the connection (drainLimit).
const errorBodyLen = 64 << 10

// GiveUpError reports a request that the client stopped trying: the reason
// is one of the sentinels ([ErrExhausted], [ErrInProgress],
// [ErrBudgetExhausted], [ErrRetryAfterTooLong], [ErrKeyRequired],
// [ErrBodyChanged], [ErrNotReplayable], [ErrPacerRefused]) or the
// context's error when the
// deadline or a cancellation ended the wait. errors.Is matches both the
// reason and the last attempt's error; an in-progress wait that the
// deadline cut short matches [ErrInProgress] and
// [context.DeadlineExceeded].
//
// No response accompanies a GiveUpError from [Client.Do]: the last
// response was read and closed, and the error carries what a caller needs
// of it to parse the API's own error (its JSON error document, its request
// id, its rate-limit headers): LastStatus, Header and Body, already read
// when Do returns, so they stay valid with the connection gone and the
// error kept, logged or passed on. They are set whenever the last attempt
// got a response, whether the client stopped at that response or during
// the wait after it (a deadline, a cancellation). [Client.StandardClient]
// hands an SDK the last response itself instead.
type GiveUpError struct {
	Method string // request method
	URL    string // request URL, with its password and secret query values redacted
	Key    string // idempotency key sent, "" if the request had none

	Attempts   int // attempts made, including the first
	LastStatus int // status of the last response, 0 if the last attempt got none

	// Header holds the last response's headers, nil if the last attempt
	// got none. It is a copy without what can carry a credential: no
	// Set-Cookie or Set-Cookie2, no Authentication-Info, no header named
	// in [Client.SecretHeaders] (nor Authorization, Cookie,
	// Proxy-Authorization or the key header), and every URL in it
	// (Location, Content-Location, Link, Refresh, a URL anywhere in
	// another value) redacted as the error's URL is: a signed URL's
	// signature, a user part and secret query values never reach the
	// error, nor the logs it is written to.
	Header http.Header

	// Body holds the last response's body, at most its first 64 KiB, nil
	// if the last attempt got none or it was empty. BodyTruncated is set
	// when Body is not the whole body: it was longer, or it did not arrive
	// in time (a body still unread 100 ms into its reading is abandoned
	// with its connection, and never holds up the call).
	Body          []byte
	BodyTruncated bool

	RetryAfter time.Duration // the server's last Retry-After hint, 0 if none

	Reason error // why the client stopped: a sentinel or a context error
	Err    error // the last attempt's error, nil if it got a response

	// NotSent: no attempt can have reached the server, and no journal
	// entry is left behind (see [ErrNotSent], which the error then
	// matches).
	NotSent bool
}

// Error describes the give-up in one line.
func (e *GiveUpError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idemhttp: %s %s: gave up after %d attempt", e.Method, e.URL, e.Attempts)
	if e.Attempts != 1 {
		b.WriteByte('s')
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " (key %s)", e.Key)
	}
	fmt.Fprintf(&b, ": %v", e.Reason)
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (Retry-After %s)", e.RetryAfter)
	}
	if e.LastStatus != 0 {
		fmt.Fprintf(&b, ": last status %d", e.LastStatus)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns the reason and the last attempt's error, so that
// [errors.Is] matches either.
func (e *GiveUpError) Unwrap() []error {
	errs := []error{e.Reason}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.NotSent {
		errs = append(errs, ErrNotSent)
	}
	return errs
}

// DoneError reports that an operation is already done in the journal, so
// [Client.Do] sent nothing: done is done, within the server's key retention
// or past it, and a batch rerun skips what its earlier run completed
// instead of resending it (or, past the retention, refusing it as
// expired). It matches [ErrAlreadyDone].
//
// To get a done operation's result back on a rerun, set
// [Policy.KeepResults] (the journal keeps a copy of the final response and
// the rerun returns it as a replay) or [Policy.RefetchDone] (the rerun asks
// the server again with the key, within the retention).
type DoneError struct {
	Operation string    // the operation id
	Key       string    // the key it was sent with
	Status    int       // the status of its definite outcome
	Attempts  int       // attempts it took, across runs
	Finished  time.Time // when it was recorded done
	Result    *Result   // the kept result, if any (set when a resend, not a rerun, met the done entry)
}

// Error describes the done operation.
func (e *DoneError) Error() string {
	return fmt.Sprintf("idemhttp: operation %q (key %s): %v with status %d at %s", e.Operation, e.Key, ErrAlreadyDone, e.Status, e.Finished.Format(time.RFC3339))
}

// Is reports whether target is [ErrAlreadyDone].
func (e *DoneError) Is(target error) bool { return target == ErrAlreadyDone }

// KeyMismatchError reports that the server refused a key because it was
// first used with a different request (IETF: 422; Stripe: 400 with
// error.type "idempotency_error"), or that a journaled operation was started
// again with a different body. It matches [ErrKeyMismatch]. Never retried.
//
// Found locally, it says what differs between the request the journal
// holds for the operation and this one, and its message shows both sides
// (URLs redacted as in every message: no user part, no secret query
// value), so that a rerun after a change of base URL, API version or
// payload is understood at once: the operation may have run, against
// the journaled request, and sending the new one needs a new operation
// id, decided by someone who checked.
type KeyMismatchError struct {
	Key        string // the key sent
	Operation  string // operation id, when the mismatch was found locally
	StatusCode int    // the server's status; 0 when found locally
	Body       []byte // first bytes (at most 512) of the server's body

	// Differs names what differs, when the mismatch was found locally:
	// some of "method", "origin" (scheme, host and port), "path",
	// "query", "url" (the URLs differ in another way, such as the case
	// of the scheme) and "body", in that order; empty when the journal's
	// fingerprint differs though none of them does (an entry written by
	// another fingerprint rule). Nil for a server's refusal, which does
	// not say.
	Differs []string

	// Journaled and Request are the journaled request and this one,
	// method and redacted URL ("POST https://api.example.com/v1/charges"),
	// when the mismatch was found locally; "" otherwise.
	Journaled, Request string

	detail string // Differs told in words, both sides shown
}

// Error describes the mismatch.
func (e *KeyMismatchError) Error() string {
	if e.StatusCode == 0 {
		msg := fmt.Sprintf("idemhttp: %v: operation %q (key %s) was started with a different request", ErrKeyMismatch, e.Operation, e.Key)
		if e.detail != "" {
			msg += ": " + e.detail
		}
		return msg
	}
	return fmt.Sprintf("idemhttp: %v: key %s: server answered %d: %s", ErrKeyMismatch, e.Key, e.StatusCode, oneLine(e.Body))
}

// localMismatch returns the error for an operation whose journaled entry
// j does not match the request now (method, journal URL and body),
// saying what differs; names and pathAfter redact the URLs it shows.
func localMismatch(j *Entry, method, url string, body []byte, names, pathAfter []string) *KeyMismatchError {
	e := &KeyMismatchError{
		Key:       j.Key,
		Operation: j.Operation,
		Journaled: j.Method + " " + contract.RedactURLString(j.URL, names, pathAfter),
		Request:   method + " " + contract.RedactURLString(url, names, pathAfter),
	}
	var parts []string
	differ := func(what, format string, args ...any) {
		e.Differs = append(e.Differs, what)
		parts = append(parts, fmt.Sprintf(format, args...))
	}
	if j.Method != method {
		differ("method", "method %s in the journal, %s now", j.Method, method)
	}
	if j.URL != url {
		was, errWas := neturl.Parse(j.URL)
		now, errNow := neturl.Parse(url)
		if errWas != nil || errNow != nil {
			differ("url", "URL %s in the journal, %s now", contract.RedactURLString(j.URL, names, pathAfter), contract.RedactURLString(url, names, pathAfter))
		} else {
			told := len(e.Differs)
			if !strings.EqualFold(was.Scheme, now.Scheme) || !strings.EqualFold(was.Host, now.Host) {
				differ("origin", "origin %s://%s in the journal, %s://%s now", was.Scheme, was.Host, now.Scheme, now.Host)
			}
			if was.EscapedPath() != now.EscapedPath() {
				differ("path", "path %q in the journal, %q now", redactedPath(was, names, pathAfter), redactedPath(now, names, pathAfter))
			}
			if was.RawQuery != now.RawQuery {
				differ("query", "query %q in the journal, %q now", redactedQuery(was, names, pathAfter), redactedQuery(now, names, pathAfter))
			}
			if len(e.Differs) == told {
				differ("url", "URL %s in the journal, %s now", contract.RedactURL(was, names, pathAfter), contract.RedactURL(now, names, pathAfter))
			}
		}
	}
	switch {
	case j.Body != nil:
		if !bytes.Equal(j.Body, body) {
			if len(j.Body) == len(body) {
				differ("body", "body of %d bytes in both, other bytes", len(body))
			} else {
				differ("body", "body of %d bytes in the journal, %d now", len(j.Body), len(body))
			}
		}
	case contract.Fingerprint(j.Method, j.URL, body) != j.Fingerprint:
		// The journal keeps no body: its fingerprint of the journaled
		// method and URL with this body tells whether the bodies differ.
		differ("body", "body differs (the journal keeps no body: %d bytes now)", len(body))
	}
	e.detail = strings.Join(parts, "; ")
	return e
}

// redactedPath is u's path as RedactURL shows it.
func redactedPath(u *neturl.URL, names, pathAfter []string) string {
	c := neturl.URL{Path: u.Path, RawPath: u.RawPath}
	return contract.RedactURL(&c, names, pathAfter)
}

// redactedQuery is u's query as RedactURL shows it.
func redactedQuery(u *neturl.URL, names, pathAfter []string) string {
	c := neturl.URL{RawQuery: u.RawQuery}
	return strings.TrimPrefix(contract.RedactURL(&c, names, pathAfter), "?")
}

// Is reports whether target is [ErrKeyMismatch].
func (e *KeyMismatchError) Is(target error) bool { return target == ErrKeyMismatch }

// oneLine renders a body snippet for an error message on a single line.
func oneLine(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if s == "" {
		return "(empty body)"
	}
	return s
}

// ParkedError reports an operation parked until the server's time: the
// call that got the server's Retry-After (Err is its [*GiveUpError],
// reason [ErrRetryAfterTooLong]), or a later call or resend refused
// before that time (Err nil). It matches [ErrParked], and what Err
// matches.
//
// The entry stays pending until then and is sent after it, within the
// server's key retention ([Policy.Retention], counted from the entry's
// creation: Expires). A NotBefore after Expires cannot be honoured: the
// server may have forgotten the key by then, so the entry is never sent
// again; the first Resume after Expires marks it abandoned
// ([ErrKeyExpired]), for a person to reconcile.
type ParkedError struct {
	Operation string    // the operation id, "" if none
	Key       string    // the key it was sent with, and will be again
	NotBefore time.Time // the earliest time it may be sent again, by the journal's clock
	Expires   time.Time // when the entry outlives the retention, by the same clock
	Err       error     // the give-up that parked it; nil for a call refused before NotBefore
}

// Error says until when the operation is parked.
func (e *ParkedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idemhttp: operation %q (key %s): %v: not before %s", e.Operation, e.Key, ErrParked, e.NotBefore.UTC().Format(time.RFC3339))
	if e.NotBefore.After(e.Expires) {
		fmt.Fprintf(&b, ", after the key's retention ends at %s: it will be abandoned, not sent", e.Expires.UTC().Format(time.RFC3339))
	}
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

// Unwrap returns [ErrParked] and the give-up, if any.
func (e *ParkedError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrParked}
	}
	return []error{ErrParked, e.Err}
}
