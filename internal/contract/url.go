package contract

import (
	"net/url"
	"strings"
)

// DefaultSecretQuery are query parameter names that carry credentials in
// common APIs (OAuth, API keys, signed URLs of S3 and GCS). Their values
// never appear in an error, an event or a log line, and a journal refuses
// a URL that carries one.
var DefaultSecretQuery = [...]string{
	"access_token", "api_key", "apikey", "api-key", "auth", "authorization",
	"client_secret", "code", "id_token", "password", "passwd", "refresh_token",
	"secret", "session", "sig", "signature", "token",
	"x-amz-credential", "x-amz-security-token", "x-amz-signature",
	"x-goog-credential", "x-goog-signature",
	"key", // Google APIs' API key parameter
}

// SecretQueryNames returns the default names and extra, in lower case.
func SecretQueryNames(extra []string) []string {
	out := make([]string, 0, len(DefaultSecretQuery)+len(extra))
	out = append(out, DefaultSecretQuery[:]...)
	for _, n := range extra {
		out = append(out, strings.ToLower(n))
	}
	return out
}

func IsSecretQueryName(name string, names []string) bool {
	for _, n := range names {
		if strings.EqualFold(name, n) {
			return true
		}
	}
	return false
}

// SecretQueryParam returns the first query parameter of u whose name is a
// secret one.
func SecretQueryParam(u *url.URL, names []string) (string, bool) {
	q := u.RawQuery
	for q != "" {
		var part string
		part, q, _ = strings.Cut(q, "&")
		name, _, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(name); err == nil {
			name = n
		}
		if IsSecretQueryName(name, names) {
			return name, true
		}
	}
	return "", false
}

// RedactURL renders u for an error, an event or a log line, without its
// secrets: the whole user part (a password, or a Stripe-style secret key
// as the user name: https://REDACTED@host), the values of its secret query
// parameters (names, see [SecretQueryNames]), the rest of the path after
// any of pathAfter (a webhook URL's token: "/services/" gives
// /services/REDACTED), and the fragment. It keeps the order and the
// spelling of everything else, so the line still shows which request it
// was.
func RedactURL(u *url.URL, names, pathAfter []string) string {
	if u == nil {
		return ""
	}
	c := *u
	if c.User != nil {
		c.User = url.User("REDACTED")
	}
	c.Fragment, c.RawFragment = "", ""
	for _, pre := range pathAfter {
		if pre != "" && strings.HasPrefix(c.Path, pre) && len(c.Path) > len(pre) {
			c.Path, c.RawPath = pre+"REDACTED", ""
			break
		}
	}
	if _, ok := SecretQueryParam(u, names); !ok {
		return c.String()
	}
	var b strings.Builder
	q := u.RawQuery
	for q != "" {
		var part string
		part, q, _ = strings.Cut(q, "&")
		if b.Len() > 0 {
			b.WriteByte('&')
		}
		name, _, hasValue := strings.Cut(part, "=")
		n := name
		if un, err := url.QueryUnescape(name); err == nil {
			n = un
		}
		if hasValue && IsSecretQueryName(n, names) {
			b.WriteString(name)
			b.WriteString("=REDACTED")
			continue
		}
		b.WriteString(part)
	}
	c.RawQuery = b.String()
	return c.String()
}

// RedactURLString is [RedactURL] for a URL held as a string (a
// *url.Error's); one that does not parse is replaced whole.
func RedactURLString(raw string, names, pathAfter []string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "REDACTED"
	}
	return RedactURL(u, names, pathAfter)
}
