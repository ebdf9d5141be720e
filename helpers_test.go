package idemhttp

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// hit is one request as the test server saw it.
type hit struct {
	Method string
	Path   string
	Key    string
	Body   string
	Header http.Header
}

// step answers one attempt.
type step func(w http.ResponseWriter, r *http.Request)

// scripted is a test server that answers the n-th request with the n-th
// step (the last step repeats) and records every request. Handlers never
// fail the test: they only record, and the test goroutine asserts.
type scripted struct {
	*httptest.Server
	mu    sync.Mutex
	hits  []hit
	steps []step
}

func newScripted(t *testing.T, steps ...step) *scripted {
	t.Helper()
	s := &scripted{steps: steps}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.hits)
	s.hits = append(s.hits, hit{Method: r.Method, Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"), Body: string(b), Header: r.Header.Clone()})
	st := s.steps[min(n, len(s.steps)-1)]
	s.mu.Unlock()
	st(w, r)
}

func (s *scripted) Hits() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// reply answers with a status, a body and header pairs.
func reply(code int, body string, kv ...string) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// drop closes the connection without answering: the client cannot tell
// whether the request was processed.
func drop(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// stall answers only after the client gave up on the attempt.
func stall(w http.ResponseWriter, r *http.Request) {
	<-r.Context().Done()
}

// fast is a policy with tiny delays, so tests never sleep for real.
func fast() *Policy {
	return &Policy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

// unnamed returns p (a new Policy when nil) with AllowUnnamed set: for
// the tests of journaled calls that are about something else than
// naming them (issue 31 §2.15).
func unnamed(p *Policy) *Policy {
	if p == nil {
		p = &Policy{}
	}
	p.AllowUnnamed = true
	return p
}
