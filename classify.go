package idemhttp

import (
	"net/http"

	"github.com/idemkit/idemhttp/idemtrace"
)

// Verdict is what a [Policy.Classify] function makes of one attempt's
// outcome.
type Verdict uint8

// The verdicts a classifier may return. See [Policy.Classify] for the
// order in which they are applied.
const (
	// VerdictDefault: no opinion; the built-in rules decide.
	VerdictDefault Verdict = iota

	// VerdictRetry: retry, as the built-in rules would retry a 503: within
	// MaxAttempts, the retry budget, the deadline and MaxRetryAfter (a
	// Retry-After on the response is honoured). For an error whose
	// outcome is unknown (a timeout or a reset after the request was
	// written) on a request that carries no key and whose method is not
	// idempotent, VerdictRetry is not enough and the built-in rule applies
	// (the error is returned): resending could run the operation twice.
	VerdictRetry

	// VerdictRetryUnsafe is VerdictRetry that also resends a request whose
	// outcome is unknown and that has neither a key nor an idempotent
	// method. The server may then run it twice: return it only for an
	// endpoint that is idempotent by its own design (an upsert, a
	// deduplicating endpoint) or whose double execution is acceptable.
	VerdictRetryUnsafe

	// VerdictReturn: do not retry; the response (or the error, untouched)
	// is returned to the caller as the built-in rules return a 404.
	VerdictReturn

	// VerdictInProgress: the response says the first request with this
	// key still runs on the server; it is waited out as a 409 in progress
	// is (InProgressPatience, no budget, not counted against MaxAttempts).
	// Ignored (the built-in rules decide) for a request without a key and
	// for an error.
	VerdictInProgress

	// VerdictMismatch: the response says the key was used with another
	// request; the call stops with a [*KeyMismatchError]. Ignored (the
	// built-in rules decide) for a request without a key and for an error.
	VerdictMismatch
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case VerdictDefault:
		return "default"
	case VerdictRetry:
		return "retry"
	case VerdictRetryUnsafe:
		return "retry_unsafe"
	case VerdictReturn:
		return "return"
	case VerdictInProgress:
		return "in_progress"
	case VerdictMismatch:
		return "mismatch"
	}
	return "invalid"
}

// PeekBody returns the first bytes (at most 4 KiB) of resp's body and
// leaves the body whole: whoever reads it next reads it from the start. It
// is meant for a [Policy.Classify] function that reads an API's own retry
// signal from the body. It returns nil for a nil resp or an empty body; a
// read error ends the peek early and is returned by the next read of the
// body. It blocks until 4 KiB or the end of the body arrive (or the
// attempt's timeout ends them): use it on error responses, not on a 2xx
// that streams.
func PeekBody(resp *http.Response) []byte {
	if resp == nil {
		return nil
	}
	return peekBody(resp)
}

// classifyResponse applies the policy's classifier, then the built-in
// rules, to an attempt that got a response.
func (p *policy) classifyResponse(resp *http.Response, sig signals, peek func() []byte) (verdict, idemtrace.RetryReason) {
	if p.classify != nil {
		switch p.classify(resp, nil) {
		case VerdictRetry, VerdictRetryUnsafe:
			return vRetry, idemtrace.ReasonClassified
		case VerdictReturn:
			return vReturn, ""
		case VerdictInProgress:
			if sig.keyed {
				return vInProgress, idemtrace.ReasonInProgress
			}
		case VerdictMismatch:
			if sig.keyed {
				return vMismatch, ""
			}
		}
	}
	return p.classifyStatus(resp, sig, peek)
}

// classifyError applies the policy's classifier to an attempt that failed
// with class, and returns the class the built-in rules then act on:
// errNotSent to retry, errPermanent to return the error, class itself
// when the classifier has no opinion. An unknown outcome of an unsafe
// request becomes retryable only with VerdictRetryUnsafe.
func (p *policy) classifyError(err error, class errClass, safe bool) (errClass, bool) {
	if p.classify == nil {
		return class, false
	}
	switch p.classify(nil, err) {
	case VerdictRetryUnsafe:
		return errNotSent, true
	case VerdictRetry:
		if class != errUnknown || safe {
			return errNotSent, true
		}
	case VerdictReturn:
		return errPermanent, true
	}
	return class, false
}
