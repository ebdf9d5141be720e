package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// alwaysSecret are the headers no journal ever stores: credentials, and
// the key header, which an entry's Key already holds.
var alwaysSecret = [...]string{"Authorization", "Cookie", "Proxy-Authorization", KeyHeader}

// IsSecretHeader reports whether name is one of the always-secret headers
// or in secret, in any letter case: a caller may fill a header map
// directly (req.Header["authorization"]), bypassing canonicalisation.
func IsSecretHeader(name string, secret []string) bool {
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
// Authorization, Cookie, Proxy-Authorization, the key header and the
// names in secret, matched in any letter case, and names without values.
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

// DropURLPassword drops a password from a URL's userinfo. The client
// strips it already; this is the last line of defence.
func DropURLPassword(raw string) (string, error) {
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
