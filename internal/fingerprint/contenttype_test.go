package fingerprint

import (
	"bytes"
	"mime"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestContentTypeParameters: version 3 tells apart two requests whose
// bytes are the same but whose Content-Type makes a handler read them
// differently (issue 30, §2.8), and keeps together two that differ only
// in spelling. Checked to fail with the Content-Type left out of version
// 3 (the boundary, charset and media type pairs shared a fingerprint).
func TestContentTypeParameters(t *testing.T) {
	multipart := "--AAA\r\n\r\n--BBB\r\n\r\n1\r\n--BBB--\r\n--AAA--\r\n"
	tests := []struct {
		name   string
		a, b   string // Content-Type values
		body   string
		differ bool
	}{
		{"multipart boundary", "multipart/form-data; boundary=AAA", "multipart/form-data; boundary=BBB", multipart, true},
		{"text charset", "text/plain; charset=iso-8859-1", "text/plain; charset=utf-8", "caf\xe9", true},
		{"json charset other than UTF-8", "application/json; charset=utf-16", "application/json", `{"a":1}`, true},
		{"form charset", "application/x-www-form-urlencoded; charset=shift_jis", "application/x-www-form-urlencoded", "a=1", true},
		{"media type", "text/csv", "text/plain", "a,b", true},
		{"another parameter", `application/json; profile="v2"`, "application/json", `{"a":1}`, true},
		{"no Content-Type", "", "text/plain", "a", true},
		{"unparsable", "application/json; charset", "application/json", `{"a":1}`, true},
		{"quoted boundary", `multipart/form-data; boundary="a;b"`, `multipart/form-data; boundary=a`, "--a;b--\r\n", true},

		{"json and UTF-8", "application/json; charset=utf-8", "application/json", `{"a":1}`, false},
		{"charset case", "text/plain; charset=UTF-8", "text/plain; charset=utf-8", "x", false},
		{"media type case", "Application/JSON", "application/json", `{"a":1}`, false},
		{"parameter order", "multipart/mixed; charset=utf-8; boundary=z", "multipart/mixed; boundary=z; charset=UTF-8", "--z--\r\n", false},
		{"parameter name case", "text/plain; CHARSET=utf-8", "text/plain; charset=utf-8", "x", false},
		{"spaces", " text/plain ;charset=utf-8", "text/plain; charset=utf-8", "x", false},
		{"quoted value", `text/plain; charset="utf-8"`, "text/plain; charset=utf-8", "x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp := func(ct string) string {
				r := httptest.NewRequest("POST", "/x", strings.NewReader(tt.body))
				if ct != "" {
					r.Header.Set("Content-Type", ct)
				}
				return Current(r, []byte(tt.body))
			}
			if tt.differ {
				assert.NotEqual(t, fp(tt.a), fp(tt.b))
			} else {
				assert.Equal(t, fp(tt.a), fp(tt.b))
			}
		})
	}
}

// TestContentTypeRepeated: a field sent twice is taken as it is, not as
// its first value.
func TestContentTypeRepeated(t *testing.T) {
	one := httptest.NewRequest("POST", "/x", strings.NewReader("a"))
	one.Header.Set("Content-Type", "text/plain")
	two := httptest.NewRequest("POST", "/x", strings.NewReader("a"))
	two.Header["Content-Type"] = []string{"text/plain", "text/csv"}
	assert.NotEqual(t, Current(one, []byte("a")), Current(two, []byte("a")))
}

// FuzzContentType checks appendContentType's fast path, for a value
// without parameters, against mime.ParseMediaType's: the same form for
// what both accept, and never a panic.
func FuzzContentType(f *testing.F) {
	for _, s := range []string{"application/json", " Text/Plain ", "a/b", "/b", "a/", "a", "a/b/c", "a/b c", "a/b\x7f", "multipart/form-data; boundary=x", `a/b; c="d;e"`, "ü/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ct string) {
		got := appendContentType(nil, []string{ct})
		if strings.ContainsAny(ct, `;"`) {
			return
		}
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || len(params) != 0 {
			if got[0] != 'r' && err != nil {
				t.Fatalf("%q: mime refuses it (%v), the fast path gave %q", ct, err, got)
			}
			return
		}
		want := appendLenString([]byte{'m'}, mt)
		want = append(want, 0)
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: fast path %q, mime %q", ct, got, want)
		}
	})
}
