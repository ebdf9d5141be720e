package contract

import (
	"net/http"
	"net/url"
	"strings"
)

// resultHeaders are the response headers a kept result may hold: what a
// caller reads to use a result (its type and encoding, where the created
// thing is, the server's request id), nothing that acts on the client
// (never Set-Cookie) or describes the connection. Content-Encoding is
// kept because the body is kept as the caller read it: encoded when the
// caller asked for an encoding itself (net/http then leaves the body as
// it came), decoded, and without the header, when net/http decoded it
// (http.Response.Uncompressed).
var resultHeaders = [...]string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Location", "Location", "Link", "Refresh",
	"Etag", "Last-Modified", "Date",
	"Request-Id", "X-Request-Id", "Stripe-Version", "Idempotent-Replayed", "Idempotency-Replayed", "Idempotency-Replay",
}

// ResultHeader returns the headers of a response that a kept result may
// hold (a copy; nil for none): the rule for what of a response rests in a
// journal, kept by the client and by every journal. Of the headers it
// keeps, every URL (Location, Content-Location, Link's targets, Refresh's
// url, and any absolute URL in any value) is redacted by
// [RedactHeaderURLs], the rule an error's headers follow too, as request
// URLs are shown (see [RedactURL]): a user part, the values of query parameters named in
// names (nil: [DefaultSecretQuery], which holds signed URLs' parameters
// such as X-Amz-Signature and sig), the path after any of pathAfter, and
// the fragment. A URL with none of those is kept as the server wrote it;
// one that does not parse becomes "REDACTED". Applying it twice gives
// the same headers.
func ResultHeader(h http.Header, names, pathAfter []string) http.Header {
	if names == nil {
		names = DefaultSecretQuery[:]
	}
	var out http.Header
	for _, name := range resultHeaders {
		v := h.Values(name)
		if len(v) == 0 || bugResultEncoding && name == "Content-Encoding" { // bugResultEncoding: a planted bug
			continue
		}
		if out == nil {
			out = make(http.Header)
		}
		vals := make([]string, len(v))
		for i, s := range v {
			vals[i] = RedactHeaderURLs(name, s, names, pathAfter)
			if bugResultURL { // a planted bug
				vals[i] = s
			}
		}
		out[name] = vals
	}
	return out
}

// redactRef returns the URI reference ref without its secrets, or ref
// itself when it has none.
func redactRef(ref string, names, pathAfter []string) string {
	u, err := url.Parse(strings.TrimSpace(ref))
	if err != nil {
		return "REDACTED"
	}
	if u.User == nil && u.Fragment == "" && u.RawFragment == "" && !secretPath(u, pathAfter) {
		if _, ok := SecretQueryParam(u, names); !ok {
			return ref
		}
	}
	return RedactURL(u, names, pathAfter)
}

// secretPath reports whether u's path continues after one of pathAfter.
func secretPath(u *url.URL, pathAfter []string) bool {
	for _, pre := range pathAfter {
		if pre != "" && strings.HasPrefix(u.Path, pre) && len(u.Path) > len(pre) {
			return true
		}
	}
	return false
}

// redactLink redacts the targets of a Link header value (RFC 8288):
// each <URI-Reference>, and the anchor parameter's quoted URI.
func redactLink(v string, names, pathAfter []string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(v, '<')
		if i < 0 {
			break
		}
		j := strings.IndexByte(v[i:], '>')
		if j < 0 {
			// An unterminated target: nothing after it can be told apart
			// from a URL.
			b.WriteString(v[:i])
			b.WriteString("REDACTED")
			v = ""
			break
		}
		b.WriteString(v[:i+1])
		b.WriteString(redactRef(v[i+1:i+j], names, pathAfter))
		b.WriteByte('>')
		v = v[i+j+1:]
	}
	b.WriteString(v)
	return redactParam(b.String(), "anchor=", names, pathAfter)
}

// redactRefresh redacts the URL of a Refresh header value ("5;
// url=https://...").
func redactRefresh(v string, names, pathAfter []string) string {
	return redactParam(v, "url=", names, pathAfter)
}

// redactParam redacts the URI that follows each occurrence of param (in
// any letter case) in v, up to the next ';' or ',' (or its closing quote
// when quoted); the rest of v is kept.
func redactParam(v, param string, names, pathAfter []string) string {
	lower := asciiLower(v)
	if !strings.Contains(lower, param) {
		return v
	}
	var b strings.Builder
	for {
		i := strings.Index(lower, param)
		if i < 0 {
			break
		}
		start := i + len(param)
		b.WriteString(v[:start])
		rest := v[start:]
		end := len(rest)
		quoted := strings.HasPrefix(rest, `"`) || strings.HasPrefix(rest, `'`)
		if quoted {
			if k := strings.IndexByte(rest[1:], rest[0]); k >= 0 {
				end = k + 2
			}
		} else if k := strings.IndexAny(rest, ";,"); k >= 0 {
			end = k
		}
		ref := rest[:end]
		if quoted && len(ref) >= 2 && ref[len(ref)-1] == ref[0] {
			b.WriteByte(ref[0])
			b.WriteString(redactRef(ref[1:len(ref)-1], names, pathAfter))
			b.WriteByte(ref[0])
		} else if quoted {
			b.WriteString(ref[:1] + "REDACTED")
		} else {
			b.WriteString(redactRef(ref, names, pathAfter))
		}
		v, lower = rest[end:], lower[start+end:]
	}
	b.WriteString(v)
	return b.String()
}

// asciiLower lowers the ASCII letters of s only, so that its bytes stay
// at the offsets they have in s (strings.ToLower replaces invalid UTF-8).
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
