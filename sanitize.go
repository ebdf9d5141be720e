package idemhttp

import (
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
)

// SafeHeader returns the headers of h that a journal may store: all but
// Authorization, Cookie, Proxy-Authorization, the key header
// ([DefaultKeyHeader]) and the names in secret, matched in any letter
// case, and names without values. It returns h itself when nothing has
// to go (then the result must not be modified), else a new map sharing
// h's value slices. A nil or empty h gives nil.
func SafeHeader(h http.Header, secret ...string) http.Header {
	return contract.SafeHeader(h, secret...)
}

// SanitizeEntry is the step every [Journal] takes before it stores an
// entry, so that the rules for what may rest on disk live in one place.
// It checks e (key and operation id as [ValidateKey] requires, attempts
// not negative) and returns the entry to store: state pending, Created
// set to now and Updated to Created when zero, the URL without its
// password, and the header as [SafeHeader] leaves it with secret. e is
// not modified; the result shares e's Body and may share its Header, and
// must not be modified.
//
// The errors wrap [ErrInvalidKey] or [ErrInvalidRequest]. A URL that
// does not parse is refused rather than stored as given: its password
// could not be found, and it could not be resent anyway.
func SanitizeEntry(e *Entry, secret ...string) (*Entry, error) {
	if e == nil {
		return nil, fmt.Errorf("idemhttp: journal begin: %w: nil entry", ErrInvalidRequest)
	}
	if err := ValidateKey(e.Key); err != nil {
		return nil, err
	}
	if e.Operation != "" {
		if err := validateOperation(e.Operation); err != nil {
			return nil, err
		}
	}
	if e.Attempts < 0 {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: negative attempts", e.Key, ErrInvalidRequest)
	}
	u, err := contract.DropURLPassword(e.URL)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: %w", e.Key, ErrInvalidRequest, err)
	}
	rec := *e
	rec.URL = u
	rec.State = StatePending
	if rec.Created.IsZero() {
		rec.Created = time.Now()
	}
	if rec.Updated.IsZero() {
		rec.Updated = rec.Created
	}
	rec.Header = contract.SafeHeader(e.Header, secret...)
	return &rec, nil
}
