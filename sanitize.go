package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// alwaysSecret are the headers no journal ever stores: credentials, and
// the key header, which the entry's Key already holds.
var alwaysSecret = [...]string{"Authorization", "Cookie", "Proxy-Authorization", DefaultKeyHeader}

// isSecret reports whether name is one of the always-secret headers or
// in secret, in any letter case: a caller may fill a header map directly
// (req.Header["authorization"]), bypassing canonicalisation.
func isSecret(name string, secret []string) bool {
	for _, s := range alwaysSecret {
		if strings.EqualFold(name, s) {
			return true
		}
	}
	for _, s := range secret {
		if strings.EqualFold(name, s) {
			return true
		}
	}
	return false
}

// dropSecrets deletes from h, in place, the headers SafeHeader leaves
// out, and extra (a key header of another name), in any letter case. For
// a header map the caller owns, such as a clone.
func dropSecrets(h http.Header, extra string, secret []string) {
	for name, vals := range h {
		if len(vals) == 0 || isSecret(name, secret) || strings.EqualFold(name, extra) {
			delete(h, name)
		}
	}
}

// SafeHeader returns the headers of h that a journal may store: all but
// Authorization, Cookie, Proxy-Authorization, the key header
// ([DefaultKeyHeader]) and the names in secret, matched in any letter
// case, and names without values. It returns h itself when nothing has
// to go (then the result must not be modified), else a new map sharing
// h's value slices. A nil or empty h gives nil.
func SafeHeader(h http.Header, secret ...string) http.Header {
	keep := 0
	for name, vals := range h {
		if len(vals) > 0 && !isSecret(name, secret) {
			keep++
		}
	}
	if keep == len(h) {
		if keep == 0 {
			return nil
		}
		return h
	}
	if keep == 0 {
		return nil
	}
	out := make(http.Header, keep)
	for name, vals := range h {
		if len(vals) > 0 && !isSecret(name, secret) {
			out[name] = vals
		}
	}
	return out
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
	u, err := dropURLPassword(e.URL)
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
	rec.Header = SafeHeader(e.Header, secret...)
	return &rec, nil
}

// dropURLPassword drops a password from a URL's userinfo. The client strips it
// already; this is the last line of defence.
func dropURLPassword(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("URL does not parse") // not err: it quotes the URL, password and all
	}
	if u.User == nil {
		return raw, nil
	}
	if _, ok := u.User.Password(); !ok {
		return raw, nil
	}
	u.User = url.User(u.User.Username())
	return u.String(), nil
}
