package sqs

import (
	"encoding/json"
	"strconv"
	"testing"
)

// FuzzParseRedrive checks parseRedrive on any attribute value: it never
// panics, and a count it accepts is at least 1 and is what the JSON says.
func FuzzParseRedrive(f *testing.F) {
	f.Fuzz(func(t *testing.T, policy string) {
		n, _, err := parseRedrive(policy)
		if err != nil {
			return
		}
		if n < 1 {
			t.Fatalf("parseRedrive(%q) = %d", policy, n)
		}
		var p struct {
			MaxReceiveCount json.RawMessage `json:"maxReceiveCount"`
		}
		if err := json.Unmarshal([]byte(policy), &p); err != nil {
			t.Fatalf("accepted %q, which is not JSON: %v", policy, err)
		}
		raw := string(p.MaxReceiveCount)
		if unq, err := strconv.Unquote(raw); err == nil {
			raw = unq
		}
		if got, err := strconv.Atoi(raw); err != nil || got != n {
			t.Fatalf("parseRedrive(%q) = %d, the JSON says %q", policy, n, raw)
		}
	})
}
