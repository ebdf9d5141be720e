package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// alwaysSecret are the headers no journal ever stores: credentials (the
// standard ones, and API keys and session tokens under the names common
// APIs give them), and the key header, which an entry's Key already
// holds. A header a caller's own API names otherwise is named by the
// caller (Client.SecretHeaders, a journal's SecretHeaders option).
var alwaysSecret = [...]string{
	"Authorization", "Cookie", "Proxy-Authorization", KeyHeader,
	"X-Api-Key", "Api-Key", "X-Auth-Token", "X-Amz-Security-Token", "X-Goog-Api-Key",
}

// IsSecretHeader reports whether name is one of the always-secret headers
// or in secret, in any letter case: a caller may fill a header map
// directly (req.Header["authorization"]), bypassing canonicalisation. A
// name that is no RFC 9110 token ("Authorization " with a space,
// "X-Api-Key:" with the colon, as a map filled from configuration may
// spell it) is secret too: net/http never sends such a header, so nothing
// needs it resent, and no letter-case rule can tell what it hides.
func IsSecretHeader(name string, secret []string) bool {
	if !isToken(name) {
		return true
	}
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

// DropSecrets deletes from h, in place, the headers SafeHeader leaves
// out, and extra (a key header of another name), in any letter case. For
// a header map the caller owns, such as a clone.
func DropSecrets(h http.Header, extra string, secret []string) {
	for name, vals := range h {
		if len(vals) == 0 || IsSecretHeader(name, secret) || strings.EqualFold(name, extra) {
			delete(h, name)
		}
	}
}

// SafeHeader returns the headers of h that a journal may store: all but
// the always-secret ones (Authorization, Cookie, Proxy-Authorization,
// the key header, X-Api-Key, Api-Key, X-Auth-Token, X-Amz-Security-Token,
// X-Goog-Api-Key) and the names in secret, matched in any letter case,
// names that are no token, and names without values.
// It returns h itself when nothing has to go (then the result must not be
// modified), else a new map sharing h's value slices. A nil or empty h
// gives nil.
func SafeHeader(h http.Header, secret ...string) http.Header {
	keep := 0
	for name, vals := range h {
		if len(vals) > 0 && !IsSecretHeader(name, secret) {
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
		if len(vals) > 0 && !IsSecretHeader(name, secret) {
			out[name] = vals
		}
	}
	return out
}

// isToken reports whether s is an RFC 9110 token: one or more tchar.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// errURLUnparsable replaces the parser's error, which quotes the URL,
// secrets and all.
var errURLUnparsable = errors.New("URL does not parse")

// JournalURL returns the form of a request URL that a journal stores: the
// URL without its fragment (never sent, and never stored), or an error
// wrapping [ErrInvalidRequest] for a URL that must not rest on disk: one
// with a user part (Stripe-style https://sk_live_...:@host, or a password)
// or with a query parameter named in secretQuery (see
// [SecretQueryNames]; nil means the defaults). Credentials belong in
// Client.PrepareRequest, which adds them to every attempt and resend
// without writing them down.
func JournalURL(raw string, secretQuery []string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("idemhttp: %w: %w", ErrInvalidRequest, errURLUnparsable)
	}
	return JournalURLOf(u, secretQuery)
}

// JournalURLOf is [JournalURL] for a parsed URL, which it does not modify.
func JournalURLOf(u *url.URL, secretQuery []string) (string, error) {
	if u.User != nil {
		return "", fmt.Errorf("idemhttp: %w: the URL carries credentials in its user part, which a journal would write to disk: add them in Client.PrepareRequest", ErrInvalidRequest)
	}
	if secretQuery == nil {
		secretQuery = DefaultSecretQuery[:]
	}
	if name, ok := SecretQueryParam(u, secretQuery); ok {
		return "", fmt.Errorf("idemhttp: %w: query parameter %q looks like a credential and a journal would write it to disk: add it in Client.PrepareRequest", ErrInvalidRequest, name)
	}
	if u.Fragment == "" && u.RawFragment == "" {
		return u.String(), nil
	}
	c := *u
	c.Fragment, c.RawFragment = "", ""
	return c.String(), nil
}

// Fingerprint returns the hex SHA-256 of a request's method, URL and
// body: what a journal compares to refuse the same operation with another
// body.
func Fingerprint(method, url string, body []byte) string {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(url))
	h.Write([]byte{0})
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// Latest returns the latest of ts, the zero Time for none.
func Latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}
