package contract

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRedactHeaderURLs(t *testing.T) {
	names := SecretQueryNames(nil)
	tests := []struct {
		name string
		give string
		want string
	}{
		{"Location", "https://files.example.com/r/1.pdf?X-Amz-Signature=abc&X-Amz-Credential=AKIA&v=2",
			"https://files.example.com/r/1.pdf?X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&v=2"},
		{"Location", "/download?sig=abc#frag", "/download?sig=REDACTED"},
		{"Content-Location", "https://u:pw@api.example.com/v1/charges/ch_1", "https://REDACTED@api.example.com/v1/charges/ch_1"},
		{"Location", "https://api.example.com/hooks/T0/secret", "https://api.example.com/hooks/REDACTED"},
		{"Link", `<https://api.example.com/v1/x?page=2&token=t1>; rel="next", </v1/x?page=9&access_token=t2>; rel="last"`,
			`<https://api.example.com/v1/x?page=2&token=REDACTED>; rel="next", </v1/x?page=9&access_token=REDACTED>; rel="last"`},
		{"Refresh", "5; url=https://h.example/p?session=s1", "5; url=https://h.example/p?session=REDACTED"},
		{"X-Error-Help", "see https://docs.example.com/errors?type=card_declined&api_key=k1 for more",
			"see https://docs.example.com/errors?type=card_declined&api_key=REDACTED for more"},
		{"Warning", `299 - "see <https://h/x?sig=s>"`, `299 - "see <https://h/x?sig=REDACTED>"`},
		{"Link", "<https://h/x?sig=s", "REDACTED"},
		{"Content-Type", "application/json; charset=utf-8", "application/json; charset=utf-8"},
		{"Request-Id", "req_123", "req_123"},
		{"X-Note", "ratio 3://4 and ://nothing", "ratio 3://4 and ://nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" "+tt.give, func(t *testing.T) {
			assert.Equal(t, tt.want, RedactHeaderURLs(tt.name, tt.give, names, []string{"/hooks/"}))
		})
	}
}

// TestErrorHeader: an error's copy of a response's headers holds no
// cookie, no credential header (the defaults and the caller's own names)
// and no URL secret, and keeps what a caller parses an API's error with.
// Checked to fail with the Set-Cookie exclusion removed, and with
// RedactHeaderURLs returning the value as it is.
func TestErrorHeader(t *testing.T) {
	h := http.Header{
		"Content-Type":        {"application/json"},
		"Request-Id":          {"req_1"},
		"Retry-After":         {"30"},
		"Set-Cookie":          {"session=S3CRET; HttpOnly"},
		"set-cookie2":         {"old=S3CRET"},
		"Authentication-Info": {`nextnonce="S3CRET"`},
		"X-Api-Key":           {"S3CRET"},
		"Location":            {"https://h.example/r?sig=S3CRET"},
		"Link":                {"<https://h.example/r?token=S3CRET>; rel=next"},
		"X-Empty":             {},
	}
	got := ErrorHeader(h, []string{"X-Api-Key"}, SecretQueryNames(nil), nil)
	assert.Equal(t, http.Header{
		"Content-Type": {"application/json"},
		"Request-Id":   {"req_1"},
		"Retry-After":  {"30"},
		"Location":     {"https://h.example/r?sig=REDACTED"},
		"Link":         {"<https://h.example/r?token=REDACTED>; rel=next"},
	}, got)
	got["Request-Id"][0] = "changed"
	assert.Equal(t, "req_1", h.Get("Request-Id"), "a copy")
	assert.Nil(t, ErrorHeader(http.Header{"Set-Cookie": {"a=b"}}, nil, nil, nil))
	assert.Nil(t, ErrorHeader(nil, nil, nil, nil))
}

// FuzzRedactHeaderURLs: whatever surrounds it, a URL that starts a word
// in a header value never shows its password or a secret query value;
// and no value makes it panic.
func FuzzRedactHeaderURLs(f *testing.F) {
	for _, s := range [][2]string{
		{"", ""},
		{"see", "for more"},
		{"<", ">; rel=next"},
		{"5; url=", ""},
		{`"`, `"`},
		{"<a", ""},
		{"x://y", "z://"},
	} {
		f.Add("Link", s[0], s[1])
		f.Add("Location", s[0], s[1])
		f.Add("Refresh", s[0], s[1])
	}
	names := SecretQueryNames(nil)
	const secretURL = "https://u:PWZZ@h.example/p?x=1&sig=SIGZZ&y=2"
	f.Fuzz(func(t *testing.T, name, prefix, suffix string) {
		once := RedactHeaderURLs(name, prefix+suffix, names, nil) // never panics
		if twice := RedactHeaderURLs(name, once, names, nil); twice != once {
			// Every journal sanitises what it is given, and a kept result
			// may pass through two (Resume's copy, a compaction).
			t.Fatalf("RedactHeaderURLs is not idempotent: %q -> %q -> %q", prefix+suffix, once, twice)
		}
		if strings.Contains(prefix+suffix, "ZZ") {
			return
		}
		v := prefix + " " + secretURL + " " + suffix
		got := RedactHeaderURLs(name, v, names, nil)
		if strings.Contains(got, "PWZZ") || strings.Contains(got, "SIGZZ") {
			t.Fatalf("RedactHeaderURLs(%q, %q) = %q shows a secret", name, v, got)
		}
	})
}

// TestRedactHeaderURLsNested: a URL inside another (a proxy's path, a
// redirect parameter) is redacted by itself, and a value nesting URLs
// past the bound is hidden from there on rather than parsed over and
// over.
func TestRedactHeaderURLsNested(t *testing.T) {
	names := SecretQueryNames(nil)
	assert.Equal(t, "https://proxy.example/https://REDACTED@h.example/p",
		RedactHeaderURLs("X-Via", "https://proxy.example/https://u:pw@h.example/p", names, nil))
	deep := strings.Repeat("https://h/", 20) + "x?sig=s"
	got := RedactHeaderURLs("X-Deep", deep, names, nil)
	assert.Equal(t, strings.Repeat("https://h/", maxNesting)+"REDACTED", got)
}
