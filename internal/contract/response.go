package contract

import (
	"net/http"
	"strings"
)

// responseCredentials are response headers that can carry a credential
// for the client: cookies the server sets (a session is a credential),
// and the digest material of HTTP authentication (RFC 7615).
var responseCredentials = [...]string{"Set-Cookie", "Set-Cookie2", "Authentication-Info", "Proxy-Authentication-Info"}

// ErrorHeader returns the headers of a response that an error may carry
// to its caller, who keeps it, logs it and passes it on long after the
// connection is gone: a copy of h (nil for none) without the headers that
// can carry a credential (Set-Cookie, Set-Cookie2, Authentication-Info,
// Proxy-Authentication-Info, and every header [IsSecretHeader] names with
// secret, the caller's own secret names), and with every URL in the
// others shown as [RedactURL] shows a request's, with names and
// pathAfter (see [RedactHeaderURLs]): a signed Location or Link keeps
// its signature only in the response, never in the error.
func ErrorHeader(h http.Header, secret, names, pathAfter []string) http.Header {
	var out http.Header
	for name, vals := range h {
		if len(vals) == 0 || IsSecretHeader(name, secret) || isResponseCredential(name) {
			continue
		}
		if out == nil {
			out = make(http.Header, len(h))
		}
		kept := make([]string, len(vals))
		for i, v := range vals {
			kept[i] = RedactHeaderURLs(name, v, names, pathAfter)
		}
		out[name] = kept
	}
	return out
}

// isResponseCredential reports whether name is one of
// responseCredentials, in any letter case.
func isResponseCredential(name string) bool {
	for _, c := range responseCredentials {
		if strings.EqualFold(name, c) {
			return true
		}
	}
	return false
}

// RedactHeaderURLs returns the value v of the header name with every URL
// in it redacted as [RedactURLString] redacts one (user part, secret query
// values, the path after pathAfter, fragment): the whole value of
// Location and Content-Location, which may be relative; Link's targets
// and its anchor parameter; the target of Refresh ("5; url=..."); every
// URI reference between angle brackets (Link: <...>; rel=next); and then
// every absolute URL (scheme://...) still anywhere in the value, up to
// the next space, quote or angle bracket, whatever the header (a
// malformed value may hold one where the header's syntax has none). A URL
// with nothing to redact is kept as the server wrote it; one that does
// not parse is replaced whole by REDACTED, and so is the rest of a value
// after an angle bracket that never closes. Text that is no URL is kept
// as it is. Applying it twice gives the same value.
//
// It is the one rule for URLs in response headers, whatever keeps them:
// an error given to the caller ([ErrorHeader]) and a result kept in a
// journal ([ResultHeader]).
func RedactHeaderURLs(name, v string, names, pathAfter []string) string {
	// Each pass parses the value as its header's syntax and then as
	// running text; a value malformed for both (an unclosed quote around
	// an unclosed bracket) can read differently once redacted. Passes
	// until nothing changes make the result a fixed point, which is what
	// "applying it twice gives the same value" needs; a value that does
	// not settle within a few passes is hidden whole.
	for range maxRedactPasses {
		w := redactHeaderURLsOnce(name, v, names, pathAfter)
		if w == v {
			return v
		}
		v = w
	}
	return "REDACTED"
}

// maxRedactPasses bounds RedactHeaderURLs's passes; values seen settle in
// two.
const maxRedactPasses = 4

func redactHeaderURLsOnce(name, v string, names, pathAfter []string) string {
	switch {
	case strings.EqualFold(name, "Location"), strings.EqualFold(name, "Content-Location"):
		if t := strings.TrimSpace(v); t != "" {
			v = redactRef(t, names, pathAfter)
		}
	case strings.EqualFold(name, "Link"):
		v = redactLink(v, names, pathAfter)
	case strings.EqualFold(name, "Refresh"):
		v = redactRefresh(v, names, pathAfter)
	}
	return redactAbsolute(redactBracketed(v, names, pathAfter), names, pathAfter)
}

// redactBracketed redacts every URI reference between angle brackets in v.
func redactBracketed(v string, names, pathAfter []string) string {
	if strings.IndexByte(v, '<') < 0 {
		return v
	}
	var b strings.Builder
	for {
		lt := strings.IndexByte(v, '<')
		if lt < 0 {
			b.WriteString(v)
			return b.String()
		}
		gt := strings.IndexByte(v[lt+1:], '>')
		if gt < 0 {
			// An angle bracket never closed: what follows may be a URL,
			// and cannot be told from one. The bracket goes too, so that
			// a second pass (every journal sanitises what it is given)
			// finds nothing more to change.
			b.WriteString(v[:lt])
			b.WriteString("REDACTED")
			return b.String()
		}
		b.WriteString(v[:lt+1])
		if ref := v[lt+1 : lt+1+gt]; ref != "" {
			b.WriteString(redactRef(ref, names, pathAfter))
		}
		b.WriteByte('>')
		v = v[lt+1+gt+1:]
	}
}

// redactAbsolute redacts every absolute URL (scheme://...) in v, each up
// to the next space, quote or angle bracket.
func redactAbsolute(v string, names, pathAfter []string) string {
	abs := absoluteURLStart(v)
	if abs < 0 {
		return v
	}
	var b strings.Builder
	for abs >= 0 {
		n := strings.IndexFunc(v[abs:], urlEnd)
		if n < 0 {
			n = len(v) - abs
		}
		b.WriteString(v[:abs])
		b.WriteString(redactNested(v[abs:abs+n], names, pathAfter))
		v = v[abs+n:]
		abs = absoluteURLStart(v)
	}
	b.WriteString(v)
	return b.String()
}

// redactNested redacts the absolute URL u and every URL nested in it (a
// proxy's path, a redirect parameter's value), the innermost first: the
// outer one's rule sees the inner one only as part of its path or query,
// and would show its user part.
// Past maxNesting levels the whole URL is REDACTED: each level parses
// the rest of the value again, and a hostile value must not make that
// quadratic.
func redactNested(u string, names, pathAfter []string) string {
	return redactNestedDepth(u, names, pathAfter, 0)
}

// maxNesting bounds how many URLs deep redactNested looks.
const maxNesting = 8

func redactNestedDepth(u string, names, pathAfter []string, depth int) string {
	own := strings.Index(u, "://") + len("://")
	if i := absoluteURLStart(u[own:]); i >= 0 {
		if depth == maxNesting {
			return "REDACTED"
		}
		u = u[:own+i] + redactNestedDepth(u[own+i:], names, pathAfter, depth+1)
	}
	return redactRef(u, names, pathAfter)
}

// absoluteURLStart returns the index in s where the first absolute URL
// (a scheme, then "://") begins, -1 for none.
func absoluteURLStart(s string) int {
	from := 0
	for {
		i := strings.Index(s[from:], "://")
		if i < 0 {
			return -1
		}
		i += from
		start := i
		for start > 0 && isSchemeByte(s[start-1]) {
			start--
		}
		// A scheme starts with a letter (RFC 3986 §3.1).
		for start < i && !isLetter(s[start]) {
			start++
		}
		if start < i {
			return start
		}
		from = i + len("://")
	}
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func isSchemeByte(c byte) bool {
	return isLetter(c) || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'
}

// urlEnd reports whether r ends an absolute URL found in running text.
// Commas and semicolons do not: they are valid inside a URL, and a URL
// cut short at one would leave the rest of its query shown.
func urlEnd(r rune) bool {
	switch r {
	case ' ', '\t', '"', '\'', '<', '>':
		return true
	}
	return false
}
