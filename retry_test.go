package idemhttp

import (
	"testing"
	"time"
)

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", " 5 ", "-1", "1.5", "99999999999999999999999", "Sun, 29 Nov 2026 12:00:30 GMT",
		"Sunday, 29-Nov-26 12:01:00 GMT", "Sun Nov 29 12:00:10 2026", "Fri, 31 Dec 9999 23:59:59 GMT", "garbage", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseRetryAfter(v, now)
		if !ok && d != 0 {
			t.Fatalf("parseRetryAfter(%q) = %v but not ok", v, d)
		}
		if d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v: a negative wait", v, d)
		}
	})
}
