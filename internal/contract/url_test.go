package contract

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzRedactURL: a redacted URL never shows a secret query value, and
// keeps every other parameter as it was.
func FuzzRedactURL(f *testing.F) {
	for _, s := range []string{
		"https://api.example.com/v1?api_key=sk_live_1&page=2",
		"https://u:p@h/x?ACCESS_TOKEN=a&token&x=1&token=b",
		"https://h/?%61pi_key=enc&q=%zz",
		"https://h/?signature=s;x=1&&&=v",
		"http://h",
		"https://sk_live_x:@api.stripe.com/v1/charges",
		"https://h/hooks/T0/B0/token#frag",
	} {
		f.Add(s)
	}
	names := SecretQueryNames([]string{"partner_sig"})
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		got := RedactURL(u, names, []string{"/hooks/"})
		out, err := url.Parse(got)
		if err != nil {
			t.Fatalf("RedactURL(%q) = %q: not a URL: %v", raw, got, err)
		}
		if out.User != nil && out.User.String() != "REDACTED" {
			t.Fatalf("redactURL(%q) = %q shows its user part", raw, got)
		}
		if strings.HasPrefix(out.Path, "/hooks/") && len(out.Path) > len("/hooks/") && out.Path != "/hooks/REDACTED" {
			t.Fatalf("redactURL(%q) = %q shows a secret path", raw, got)
		}
		if out.Fragment != "" {
			t.Fatalf("redactURL(%q) = %q shows its fragment", raw, got)
		}
		for _, part := range strings.Split(out.RawQuery, "&") {
			name, value, ok := strings.Cut(part, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			if ok && IsSecretQueryName(name, names) && value != "REDACTED" {
				t.Fatalf("RedactURL(%q) = %q shows %s", raw, got, part)
			}
		}
	})
}
