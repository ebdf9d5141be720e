package idemserver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Problem type URIs: the type member of each problem the middleware
// answers with. Each names the constant's own documentation, so a person
// who follows one lands on its explanation; a client recognises a problem by
// comparing the URI, never by parsing the title.
const (
	// TypeKeyMissing: 400, the method requires an idempotency key and the
	// request carried none (IETF draft, "Idempotency-Key is missing").
	TypeKeyMissing = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeKeyMissing"
	// TypeKeyInvalid: 400, the key header is malformed: more than one
	// value, not 1-255 printable ASCII, or not in the form the server
	// accepts (see [KeyForm]).
	TypeKeyInvalid = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeKeyInvalid"
	// TypeKeyMismatch: 422, the key was first used with a different request
	// (method, path, query or body) and must not be reused for this one.
	TypeKeyMismatch = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeKeyMismatch"
	// TypeInProgress: 409, a request with the same key is still being
	// processed; retry with the same key after Retry-After.
	TypeInProgress = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeInProgress"
	// TypeBodyTooLarge: 413, the request body exceeds the middleware's
	// MaxBodyBytes, so it cannot be fingerprinted.
	TypeBodyTooLarge = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeBodyTooLarge"
	// TypeBodyUnreadable: 400, reading the request body failed (the client
	// went away or sent a malformed body).
	TypeBodyUnreadable = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeBodyUnreadable"
	// TypeStoreUnavailable: 503, the store could not be asked whether the key
	// was seen, so the request was not run; retry after Retry-After.
	TypeStoreUnavailable = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeStoreUnavailable"
	// TypeStoreFull: 503, the store is at its bound (see [ErrStoreFull])
	// and refused to record the key rather than evict another; the request
	// was not run. Retry with the same key after Retry-After.
	TypeStoreFull = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeStoreFull"
	// TypeNotReplayable: 410, a request with this key ran, but its
	// response was not stored: too large (see [Middleware].MaxStoredBody),
	// or sent on a connection the handler took over (a hijack, 101
	// Switching Protocols). It cannot be replayed, and it will not be run
	// again while the key is kept (the TTL). The problem's original_status
	// member is the status the handler answered, when known. Do not retry:
	// look the outcome up by other means.
	TypeNotReplayable = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeNotReplayable"
	// TypeNoPrincipal: 500, the server could not tell whose key the
	// request carries (the middleware's Principal returned an empty scope),
	// so it did not process the request. The server's log says so; the
	// fix is the server's (authenticate before the middleware runs).
	TypeNoPrincipal = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeNoPrincipal"
)

// Problem is an RFC 9457 problem detail, the body of every error the
// middleware answers with itself. The titles of the key problems are the
// IETF Idempotency-Key draft's.
type Problem struct {
	Type   string `json:"type"`             // one of the Type constants
	Title  string `json:"title"`            // short, fixed per type
	Status int    `json:"status"`           // HTTP status code
	Detail string `json:"detail,omitempty"` // what went wrong with this request
	Key    string `json:"key,omitempty"`    // the idempotency key, when it was valid

	// OriginalStatus is the status the handler answered the first request
	// with; set only for [TypeNotReplayable].
	OriginalStatus int `json:"original_status,omitempty"`
}

// WriteProblem writes p as application/problem+json with status p.Status.
// It is the middleware's default error writer; a custom WriteError can
// call it for the problems it does not render itself.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // unreachable: every field is a string or an int
		body = []byte(`{"title":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body) // a failed write means the client left; nothing to tell it
}

func problemKeyMissing(header string) *Problem {
	return &Problem{
		Type:   TypeKeyMissing,
		Title:  header + " is missing",
		Status: http.StatusBadRequest,
		Detail: "This operation requires an " + header + " header; send a unique key and reuse it on every retry.",
	}
}

func problemKeyInvalid(header, detail string) *Problem {
	return &Problem{
		Type:   TypeKeyInvalid,
		Title:  header + " is invalid",
		Status: http.StatusBadRequest,
		Detail: detail,
	}
}

func problemKeyMismatch(header, key string) *Problem {
	return &Problem{
		Type:   TypeKeyMismatch,
		Title:  header + " is already used",
		Status: http.StatusUnprocessableEntity,
		Detail: "This key was first used with a different request (method, path, query or body); a key must not be reused for another request.",
		Key:    key,
	}
}

func problemInProgress(header, key string) *Problem {
	return &Problem{
		Type:   TypeInProgress,
		Title:  "A request is outstanding for this " + header,
		Status: http.StatusConflict,
		Detail: "A request with the same key is still being processed; retry with the same key after Retry-After.",
		Key:    key,
	}
}

func problemBodyTooLarge(limit int64) *Problem {
	return &Problem{
		Type:   TypeBodyTooLarge,
		Title:  "Request body too large",
		Status: http.StatusRequestEntityTooLarge,
		Detail: "The request body exceeds " + strconv.FormatInt(limit, 10) + " bytes.",
	}
}

func problemBodyUnreadable() *Problem {
	return &Problem{
		Type:   TypeBodyUnreadable,
		Title:  "Request body unreadable",
		Status: http.StatusBadRequest,
		Detail: "The request body could not be read.",
	}
}

func problemStoreUnavailable(key string) *Problem {
	return &Problem{
		Type:   TypeStoreUnavailable,
		Title:  "Idempotency store unavailable",
		Status: http.StatusServiceUnavailable,
		Detail: "The server could not check whether this key was seen before, so it did not process the request; retry with the same key.",
		Key:    key,
	}
}

func problemStoreFull(key string) *Problem {
	return &Problem{
		Type:   TypeStoreFull,
		Title:  "Idempotency store full",
		Status: http.StatusServiceUnavailable,
		Detail: "The server cannot record another key at the moment, so it did not process the request; retry with the same key after Retry-After.",
		Key:    key,
	}
}

func problemNotReplayable(header, key string, status int) *Problem {
	return &Problem{
		Type:           TypeNotReplayable,
		Title:          "Response for this " + header + " not stored",
		Status:         http.StatusGone,
		Detail:         "A request with this key ran" + withStatus(status) + ", but its response was not stored, so it cannot be replayed; the request will not run again under this key.",
		Key:            key,
		OriginalStatus: status,
	}
}

func problemNoPrincipal() *Problem {
	return &Problem{
		Type:   TypeNoPrincipal,
		Title:  "Idempotency key has no principal",
		Status: http.StatusInternalServerError,
		Detail: "The server could not tell whose idempotency key this request carries, so it did not process it.",
	}
}

// withStatus is " with status N", or "" for an unknown status (0).
func withStatus(status int) string {
	if status == 0 {
		return ""
	}
	return " with status " + strconv.Itoa(status)
}

// keyProblemDetail turns a key parsing error into a sentence for a
// problem's detail: the reason alone, without the Go error's prefixes
// ("idemhttp: invalid idempotency key: "), capitalised and with a stop.
func keyProblemDetail(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	if msg == "" {
		return "The key is invalid."
	}
	if c := msg[0]; c >= 'a' && c <= 'z' {
		msg = string(c-'a'+'A') + msg[1:]
	}
	return strings.TrimSuffix(msg, ".") + "."
}
