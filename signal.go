package idemhttp

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// This file tells an idempotency signal (the server's word about the key:
// "still in progress", "used with another request", "missing") from an
// application's own 409, 422 or 400 with the same status. Many APIs answer
// 422 for validation and 409 for a business conflict; reading those as key
// signals would retry a conflict for the whole in-progress patience, or
// report a validation error as a key reuse.
//
// The evidence, strongest first:
//   - the key cannot have been used before: a key minted for this call, on
//     its first attempt, which net/http did not resend by itself; then no
//     status is an idempotency signal, whatever the body says;
//   - the body: an RFC 9457 problem whose type or title names idempotency
//     (the IETF draft's examples, idemserver's types), a Stripe error of
//     type idempotency_error or whose message names the key, or any body
//     that mentions idempotency; a JSON body that does not is the
//     application's;
//   - for 409, a Retry-After or Stripe-Should-Retry: true (the server asks
//     for the retry);
//   - for a 409 with no evidence either way (no body, not JSON), whether
//     the key can have been used before: then it is taken as in progress,
//     since retrying with the same key is safe and the first attempt may
//     indeed still run.
// A 422 is read the same way: a bare one (no body, HTML, plain text) to a
// key that may have been used is a key mismatch, as deployed servers
// answer key reuse; a structured body about something else is the
// application's validation error.

// signals are the facts about a call that classifyStatus needs.
type signals struct {
	keyed bool // the request carries a key
	safe  bool // keyed or an idempotent method
	fresh bool // the key cannot have been used before this attempt
}

// evidence is what a response body says about idempotency.
type evidence uint8

const (
	evNone        evidence = iota // empty, or not a format that says anything
	evIdempotency                 // names idempotency or the key
	evOther                       // a structured error about something else
)

// bodyEvidence reads the first bytes of an error body.
func bodyEvidence(b []byte) evidence {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return evNone
	}
	if containsFold(b, "idempoten") {
		return evIdempotency
	}
	if b[0] == '{' && json.Valid(b) {
		return evOther
	}
	return evNone
}

// containsFold reports whether b contains the lower-case ASCII word w in
// any letter case, without allocating.
func containsFold(b []byte, w string) bool {
	for i := 0; i+len(w) <= len(b); i++ {
		j := 0
		for ; j < len(w); j++ {
			c := b[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != w[j] {
				break
			}
		}
		if j == len(w) {
			return true
		}
	}
	return false
}

// isStripeIdempotencyError recognises Stripe's refusal of a reused key:
// 400 with {"error": {"type": "idempotency_error"}}.
func isStripeIdempotencyError(b []byte) bool {
	if !bytes.Contains(b, []byte("idempotency_error")) {
		return false
	}
	var v struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &v) == nil && v.Error.Type == "idempotency_error"
}

// isKeyMissingProblem recognises the IETF draft's 400 for a missing key: a
// problem document whose type or title names the idempotency key.
func isKeyMissingProblem(b []byte) bool {
	var v struct {
		Type  string `json:"type"`
		Title string `json:"title"`
	}
	if json.Unmarshal(b, &v) != nil {
		return false
	}
	return strings.Contains(strings.ToLower(v.Type+" "+v.Title), "idempotency")
}

// inProgress reports whether a 409 to a keyed request says that the first
// request with the key is still running.
func inProgress(resp *http.Response, sig signals, peek func() []byte) bool {
	if sig.fresh {
		return false
	}
	switch bodyEvidence(peek()) {
	case evIdempotency:
		return true
	case evOther:
		return hintsRetry(resp)
	}
	return true
}

// hintsRetry reports whether resp asks for a retry in its headers.
func hintsRetry(resp *http.Response) bool {
	return resp.Header.Get("Retry-After") != "" || resp.Header.Get("Stripe-Should-Retry") == "true"
}
