package idemhttp

import (
	"fmt"

	"github.com/idemkit/idemhttp/internal/contract"
)

// Sanitized returns the entry a [Journal] may store for e: the one rule
// for what rests on disk, which every journal applies to every entry it is
// given, by a Client or directly (a producer loading a batch). It checks
// the key and operation id (the key rules: 1 to 255 bytes of printable
// ASCII), that attempts are not negative, and that the URL carries no
// credentials (a user part, or a query parameter with a credential's
// name such as api_key or access_token: see [Policy.RedactQuery]); it
// drops the URL's fragment, and the Authorization, Cookie,
// Proxy-Authorization and key headers (in any letter case), and headers
// without values; it sets the state to pending, and computes the
// Fingerprint from Method, URL and Body when it is empty. A zero Updated
// becomes Created; a zero Created is left for the journal to stamp with
// its clock. The
// headers a Client's SecretHeaders names never reach a journal: the
// client drops them before Begin.
//
// e is not modified; the result shares e's Body and may share its Header,
// and must not be modified. The errors wrap [ErrInvalidKey] or
// [ErrInvalidRequest]; a URL that does not parse is refused rather than
// stored as given.
func (e *Entry) Sanitized() (*Entry, error) {
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
	if rec.Updated.IsZero() {
		rec.Updated = rec.Created
	}
	if rec.Fingerprint == "" {
		rec.Fingerprint = contract.Fingerprint(rec.Method, rec.URL, rec.Body)
	}
	rec.Header = contract.SafeHeader(e.Header)
	return &rec, nil
}
