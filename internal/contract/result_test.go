package contract

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestResultHeader: a kept result holds the headers a caller reads, the
// URL-valued ones without credentials (signed URLs' signatures and
// credentials, secret query values, user parts, fragments), and nothing
// else. Checked to fail with Location's redaction removed (the signed-URL
// and user-part rows), with Link's (the Link rows), with Refresh's, and
// with Content-Encoding left out of the kept headers.
func TestResultHeader(t *testing.T) {
	tests := []struct {
		name string
		give http.Header
		want http.Header
	}{
		{
			name: "kept as written",
			give: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}, "Request-Id": {"req_1"}},
			want: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}, "Request-Id": {"req_1"}},
		},
		{
			name: "never Set-Cookie nor connection headers",
			give: http.Header{"Set-Cookie": {"s=secret"}, "Connection": {"close"}, "X-Amz-Security-Token": {"tok"}},
		},
		{
			name: "encoded body keeps its encoding",
			give: http.Header{"Content-Encoding": {"gzip"}, "Content-Type": {"application/json"}},
			want: http.Header{"Content-Encoding": {"gzip"}, "Content-Type": {"application/json"}},
		},
		{
			name: "S3 presigned Location",
			give: http.Header{"Location": {"https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20250301&X-Amz-Signature=deadbeefsecret&X-Amz-Expires=300"}},
			want: http.Header{"Location": {"https://b.s3.amazonaws.com/o?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Expires=300"}},
		},
		{
			name: "Azure SAS Content-Location",
			give: http.Header{"Content-Location": {"https://a.blob.core.windows.net/c/b?sv=2022&sig=secretsig%3D"}},
			want: http.Header{"Content-Location": {"https://a.blob.core.windows.net/c/b?sv=2022&sig=REDACTED"}},
		},
		{
			name: "user part and fragment",
			give: http.Header{"Location": {"https://sk_live_secret:@api.example.com/x#access_token=secret"}},
			want: http.Header{"Location": {"https://REDACTED@api.example.com/x"}},
		},
		{
			name: "relative reference with a token",
			give: http.Header{"Location": {"/download?token=secret&id=7"}},
			want: http.Header{"Location": {"/download?token=REDACTED&id=7"}},
		},
		{
			name: "unparsable",
			give: http.Header{"Location": {"https://h/%zz?sig=secret"}},
			want: http.Header{"Location": {"REDACTED"}},
		},
		{
			name: "Link targets and anchor",
			give: http.Header{"Link": {`<https://h/p?page=2&access_token=secret>; rel="next", </x?sig=s2>; rel="alternate"; anchor="https://u:p@h/y"`}},
			want: http.Header{"Link": {`<https://h/p?page=2&access_token=REDACTED>; rel="next", </x?sig=REDACTED>; rel="alternate"; anchor="https://REDACTED@h/y"`}},
		},
		{
			name: "Link unterminated",
			give: http.Header{"Link": {`<https://h/p?token=secret; rel=next`}},
			want: http.Header{"Link": {`REDACTED`}},
		},
		{
			name: "Refresh",
			give: http.Header{"Refresh": {"5; URL=https://h/done?session=secret"}},
			want: http.Header{"Refresh": {"5; URL=https://h/done?session=REDACTED"}},
		},
		{
			name: "Refresh quoted",
			give: http.Header{"Refresh": {`0;url='https://h/x?code=secret'`}},
			want: http.Header{"Refresh": {`0;url='https://h/x?code=REDACTED'`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ResultHeader(tt.give, nil, nil)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, got, ResultHeader(got, nil, nil), "applied twice, the same")
			for _, vals := range got {
				for _, v := range vals {
					assert.NotContains(t, v, "secret")
				}
			}
		})
	}
}

// The client adds its policy's names and paths to the journal's defaults.
func TestResultHeaderPolicyNames(t *testing.T) {
	h := http.Header{"Location": {"https://h/hooks/T0/B0/tok?partner_sig=secret&x=1"}}
	got := ResultHeader(h, SecretQueryNames([]string{"partner_sig"}), []string{"/hooks/"})
	assert.Equal(t, http.Header{"Location": {"https://h/hooks/REDACTED?partner_sig=REDACTED&x=1"}}, got)
}

// FuzzResultHeader: whatever the server sends, a kept Location or Link
// target never shows a secret query value or a user part.
func FuzzResultHeader(f *testing.F) {
	for _, s := range []string{
		"https://h/o?X-Amz-Signature=abc&X-Amz-Credential=AK%2Fx",
		"/x?sig=1&sig=2",
		"https://u:p@h/",
		"<https://h/?token=1>; rel=next, <bad",
		"5; url=https://h/?code=1",
		"0, URL = 'https://h/?sig=1'",
		"%zz",
		"",
	} {
		f.Add(s)
	}
	names := SecretQueryNames(nil)
	f.Fuzz(func(t *testing.T, v string) {
		got := ResultHeader(http.Header{"Location": {v}, "Link": {v}, "Refresh": {v}}, nil, nil)
		loc := got.Get("Location")
		if loc == "REDACTED" {
			return
		}
		u, err := url.Parse(strings.TrimSpace(loc))
		if err != nil {
			t.Fatalf("Location %q kept as %q, which does not parse", v, loc)
		}
		if u.User != nil && u.User.String() != "REDACTED" {
			t.Fatalf("Location %q kept as %q: a user part", v, loc)
		}
		for name, vals := range u.Query() {
			if IsSecretQueryName(name, names) {
				for _, val := range vals {
					if val != "REDACTED" && val != "" {
						t.Fatalf("Location %q kept as %q: %s=%s", v, loc, name, val)
					}
				}
			}
		}
	})
}
