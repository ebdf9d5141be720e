package idemhttp

import (
	"fmt"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
)

// Sanitized returns the entry a [Journal] may store for e: the one rule
// for what rests on disk, which every journal applies to every entry it is
// given, by a Client or directly (a producer loading a batch). It checks
// the key and operation id (the key rules: 1 to 255 bytes of printable
// ASCII), that attempts are not negative, and that the URL carries no
// credentials (a user part, or a query parameter with a credential's
// name such as api_key or access_token: see [Policy.RedactQuery]); it
// drops the URL's fragment, the headers without values or whose names
// are no token (net/http never sends them), and the secret headers in
// any letter case: Authorization, Cookie, Proxy-Authorization,
// the key header, the API keys and tokens of common APIs (X-Api-Key,
// Api-Key, X-Auth-Token, X-Amz-Security-Token, X-Goog-Api-Key), and the
// names in secretHeaders (a journal's SecretHeaders option; a Client
// drops its own [Client.SecretHeaders] before Begin). It sets the state
// to pending, keeps NotBefore (a producer may enqueue an entry to be sent
// later), and computes the Fingerprint from Method, URL and Body when it
// is empty. A zero Updated becomes Created; a zero Created is left for the
// journal to stamp with its clock. A Result is dropped: an entry begins
// pending.
//
// e is not modified; the result shares e's Body and may share its Header,
// and must not be modified. The errors wrap [ErrInvalidKey] or
// [ErrInvalidRequest]; a URL that does not parse is refused rather than
// stored as given.
func (e *Entry) Sanitized(secretHeaders ...string) (*Entry, error) {
	if e == nil {
		return nil, fmt.Errorf("idemhttp: journal begin: %w: nil entry", ErrInvalidRequest)
	}
	if err := contract.ValidateKey(e.Key); err != nil {
		return nil, err
	}
	if e.Operation != "" {
		if err := contract.ValidateOperation(e.Operation); err != nil {
			return nil, err
		}
	}
	if e.Attempts < 0 {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: negative attempts", e.Key, ErrInvalidRequest)
	}
	u, err := contract.JournalURL(e.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w", e.Key, err)
	}
	rec := *e
	rec.URL = u
	rec.State = StatePending
	rec.Result = nil
	if rec.Updated.IsZero() {
		rec.Updated = rec.Created
	}
	if rec.Fingerprint == "" {
		rec.Fingerprint = contract.Fingerprint(rec.Method, rec.URL, rec.Body)
	}
	rec.Header = contract.SafeHeader(e.Header, secretHeaders...)
	return &rec, nil
}

// Sanitized returns the outcome a [Journal] may record for o: the one
// rule for what of a call's end rests on disk, which every journal's
// Finish applies, whoever calls it. It checks that the state is pending,
// done or abandoned and that attempts are not negative (errors wrapping
// [ErrInvalidRequest]); it keeps a Result only with state done, and a
// NotBefore only with state pending; and it keeps of the Result's headers
// only those a caller reads, never Set-Cookie, with the URLs they hold
// (Location, Content-Location, Link, Refresh) redacted as request URLs
// are in logs: a user part, the values of credential query parameters
// (signed URLs' X-Amz-Signature, X-Amz-Credential, sig; api_key,
// access_token and the rest of [Policy.RedactQuery]'s defaults) and the
// fragment become REDACTED. The result shares o.Result's Body.
func (o Outcome) Sanitized() (Outcome, error) {
	switch o.State {
	case StatePending, StateDone, StateAbandoned:
	default:
		return o, fmt.Errorf("%w: unknown state %q", ErrInvalidRequest, o.State)
	}
	if o.Attempts < 0 {
		return o, fmt.Errorf("%w: negative attempts", ErrInvalidRequest)
	}
	if o.State != StatePending {
		o.NotBefore = time.Time{}
	}
	if o.State != StateDone || o.Result == nil {
		o.Result = nil
		return o, nil
	}
	o.Result = &Result{Status: o.Result.Status, Header: contract.ResultHeader(o.Result.Header, nil, nil), Body: o.Result.Body}
	return o, nil
}
