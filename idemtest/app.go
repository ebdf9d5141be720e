package idemtest

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemkit/idemhttp/idemserver"
)

// Problem types of the faults the server answers itself.
const (
	// TypeUnavailable: an injected 503 (FaultUnavailable).
	TypeUnavailable = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemtest#TypeUnavailable"
	// TypeOutage: a 503 inside an outage window (FaultOutage).
	TypeOutage = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemtest#TypeOutage"
	// TypeInternal: an injected, stored 500 (FaultStored500).
	TypeInternal = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemtest#TypeInternal"
	// TypeRateLimited: a 429 beyond the rate limit (FaultRateLimited).
	TypeRateLimited = "https://pkg.go.dev/github.com/idemkit/idemhttp/idemtest#TypeRateLimited"
)

// Operation returns the operation a request body names: the top-level
// "operation" member of a JSON object (or its "metadata.operation"), or the
// form field operation or metadata[operation] of a form-encoded body, the
// way stripe-go sends metadata. contentType picks the decoding; an empty
// or unparsable one is sniffed: a body starting with '{' is JSON, anything
// else a form. Operation returns "" when the body names none. The fake
// API reads a request's parameters by the same rule, so a body it takes an
// operation from is the body it charges.
func Operation(contentType string, body []byte) string {
	switch formatOf(contentType, body) {
	case formatJSON:
		return jsonOperation(body)
	case formatForm:
		return formOperation(body)
	}
	return ""
}

// bodyFormat is how the fake API decodes a request body.
type bodyFormat int

const (
	formatNone bodyFormat = iota // another media type: no parameters
	formatJSON
	formatForm
)

// formatOf is the one rule for decoding a body, used for its operation
// ([Operation]) and for its parameters alike: JSON for application/json
// and any +json type, a form for application/x-www-form-urlencoded, and
// for a missing or unparsable Content-Type, JSON when the body starts
// with '{' (after white space), else a form. Any other type has neither.
func formatOf(contentType string, body []byte) bodyFormat {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		return formatJSON
	case mt == "application/x-www-form-urlencoded":
		return formatForm
	case mt == "":
		if s := strings.TrimLeft(string(body), " \t\r\n"); strings.HasPrefix(s, "{") {
			return formatJSON
		}
		return formatForm
	}
	return formatNone
}

func jsonOperation(body []byte) string {
	var v struct {
		Operation json.RawMessage `json:"operation"`
		Metadata  json.RawMessage `json:"metadata"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	if op, ok := jsonString(v.Operation); ok {
		return op
	}
	var meta struct {
		Operation json.RawMessage `json:"operation"`
	}
	if json.Unmarshal(v.Metadata, &meta) != nil {
		return ""
	}
	op, _ := jsonString(meta.Operation)
	return op
}

// jsonString decodes raw as a JSON string; numbers, objects and the rest
// name no operation.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func formOperation(body []byte) string {
	vals, _ := url.ParseQuery(string(body)) // keeps the pairs that parse
	if op := vals.Get("operation"); op != "" {
		return op
	}
	return vals.Get("metadata[operation]")
}

// params reads a request's parameters, as strings, from a JSON object or
// a form, decided by [formatOf] as the operation is.
func params(r *http.Request, body []byte) url.Values {
	switch formatOf(r.Header.Get("Content-Type"), body) {
	case formatJSON:
		var m map[string]json.RawMessage
		if json.Unmarshal(body, &m) != nil {
			return url.Values{}
		}
		vals := url.Values{}
		for k, raw := range m {
			var s string
			if json.Unmarshal(raw, &s) == nil {
				vals.Set(k, s)
			} else {
				vals.Set(k, string(raw)) // numbers and literals as written
			}
		}
		return vals
	case formatForm:
		vals, _ := url.ParseQuery(string(body)) // keeps the pairs that parse
		return vals
	}
	return url.Values{}
}

// charge is the Stripe-like object POST /v1/charges creates.
type charge struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	Currency       string            `json:"currency"`
	Captured       bool              `json:"captured"`
	Paid           bool              `json:"paid"`
	Status         string            `json:"status"`
	Livemode       bool              `json:"livemode"`
	Created        int64             `json:"created"`
	Description    string            `json:"description,omitempty"`
	Metadata       map[string]string `json:"metadata"`
}

type ctxKey int

const (
	opCtxKey ctxKey = iota
	failCtxKey
)

// opFrom returns the operation identity the fault layer put in ctx.
func opFrom(ctx context.Context) string {
	op, _ := ctx.Value(opCtxKey).(string)
	return op
}

// app is the fake API behind the middleware.
func (s *Server) app() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", s.createCharge)
	mux.HandleFunc("/", s.generic)
	return mux
}

// createCharge validates like Stripe (a positive integer amount and a
// currency), performs the side effect once and answers with the charge.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	if s.injectedFailure(w, r) {
		return
	}
	body := bodyOf(r)
	p := params(r, body)
	amount, err := strconv.ParseInt(p.Get("amount"), 10, 64)
	switch {
	case p.Get("amount") == "":
		writeStripeError(w, http.StatusBadRequest, "invalid_request_error", "Missing required param: amount.", "amount")
		return
	case err != nil || amount <= 0:
		writeStripeError(w, http.StatusBadRequest, "invalid_request_error", "Invalid positive integer", "amount")
		return
	case p.Get("currency") == "":
		writeStripeError(w, http.StatusBadRequest, "invalid_request_error", "Missing required param: currency.", "currency")
		return
	}
	op := opFrom(r.Context())
	s.execute(op)
	metadata := map[string]string{}
	for k, v := range p {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") {
			metadata[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	if op != "" {
		metadata["operation"] = op
	}
	writeJSON(w, http.StatusOK, charge{
		ID:             fmt.Sprintf("ch_%024d", s.seq.Add(1)),
		Object:         "charge",
		Amount:         amount,
		AmountCaptured: amount,
		Currency:       strings.ToLower(p.Get("currency")),
		Captured:       true,
		Paid:           true,
		Status:         "succeeded",
		Created:        s.now().Unix(),
		Description:    p.Get("description"),
		Metadata:       metadata,
	})
}

// generic serves every other path: GET and HEAD report status without a
// side effect; any other method performs the operation's side effect.
func (s *Server) generic(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		writeJSON(w, http.StatusOK, map[string]any{"object": "status", "ok": true})
		return
	}
	if s.injectedFailure(w, r) {
		return
	}
	op := opFrom(r.Context())
	n := s.execute(op)
	writeJSON(w, http.StatusOK, map[string]any{
		"id":        fmt.Sprintf("op_%024d", s.seq.Add(1)),
		"object":    "operation",
		"operation": op,
		"method":    r.Method,
		"path":      r.URL.Path,
		"execution": n,
	})
}

// injectedFailure answers 500 without doing the work when the fault layer
// chose FaultStored500 for this request.
func (s *Server) injectedFailure(w http.ResponseWriter, r *http.Request) bool {
	if fail, _ := r.Context().Value(failCtxKey).(bool); !fail {
		return false
	}
	s.writeError(w, r, &idemserver.Problem{
		Type:   TypeInternal,
		Title:  "Internal server error",
		Status: http.StatusInternalServerError,
		Detail: "An injected failure; it is stored and replayed for this key.",
	})
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // unreachable: the values are plain maps and structs
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// stripeError is the body of a Stripe API error.
type stripeError struct {
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Param   string `json:"param,omitempty"`
	} `json:"error"`
}

func writeStripeError(w http.ResponseWriter, status int, typ, msg, param string) {
	var e stripeError
	e.Error.Type, e.Error.Message, e.Error.Param = typ, msg, param
	writeJSON(w, status, e)
}

// writeStripeProblem renders a problem the way Stripe reports it: a reused
// key is 400 idempotency_error; a key in use, 409 invalid_request_error;
// server faults api_error; Stripe-Should-Retry says which to retry.
func writeStripeProblem(w http.ResponseWriter, _ *http.Request, p *idemserver.Problem) {
	status, typ, retry := p.Status, "invalid_request_error", ""
	switch {
	case p.Type == idemserver.TypeKeyMismatch:
		status, typ, retry = http.StatusBadRequest, "idempotency_error", "false"
	case p.Type == idemserver.TypeInProgress:
		retry = "true"
	case p.Status >= 500:
		typ = "api_error"
		if p.Status == http.StatusServiceUnavailable {
			retry = "true"
		}
	}
	if retry != "" {
		w.Header().Set("Stripe-Should-Retry", retry)
	}
	msg := p.Title
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	writeStripeError(w, status, typ, msg, "")
}
