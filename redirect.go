package idemhttp

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// checkRedirect wraps the caller's CheckRedirect (nil: net/http's default
// of 10 redirects) with the rules that keep a key, a body and credentials
// from reaching a host the caller did not name.
//
// net/http, left alone, follows a redirect to any host: it drops
// Authorization, Cookie and WWW-Authenticate there, but copies every other
// header (the Idempotency-Key, an API key that PrepareRequest set as
// X-Api-Key) and, for 307 and 308, resends the body. So a keyed request,
// or one whose headers PrepareRequest set or that names a secret header,
// is not followed to another origin: the 3xx response comes back to the
// caller instead. A redirect that changes the method (303, or 301/302
// after a POST) makes a new request, which must not carry the key of the
// one it replaces.
func checkRedirect(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if a := attemptFrom(req.Context()); a != nil && len(via) > 0 {
			first := via[0]
			if a.keyed && req.Method != first.Method {
				deleteFold(req.Header, a.p.keyHeader)
			}
			if !sameOrigin(first.URL, req.URL) && (a.keyed || a.cfg.prepare != nil || carriesSecret(first.Header, a.cfg.secrets)) {
				// Nothing ran at the target: the 3xx leaves the
				// operation pending (operation.outcome).
				return http.ErrUseLastResponse
			}
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
}

// sameOrigin reports whether a and b have the same scheme and host (port
// included), in any letter case.
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Host, b.Host)
}

// carriesSecret reports whether h has one of the caller's secret headers.
func carriesSecret(h http.Header, secrets []string) bool {
	for _, s := range secrets {
		if hasHeaderFold(h, s) {
			return true
		}
	}
	return false
}
