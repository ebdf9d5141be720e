// Package storeharness is the test harness shared by the idemserver store
// tests of the contrib modules: a handler that counts its side effects, a
// middleware server over a store, a client that reports what came back, and
// the many-instances-one-key race. It is internal: for this repository's
// tests only.
package storeharness

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// Effects is a handler whose side effect is counted: each run of an
// operation (the request body) increments its count, and the response
// names the operation and the run, so that a replay to the wrong caller
// shows.
type Effects struct {
	mu      sync.Mutex
	runs    map[string]int
	gate    chan struct{} // when not nil, each run waits for it to close
	started chan string   // when not nil, receives the operation as a run starts
}

// GateTimeout bounds a run's wait for its gate, so that a failing test
// cannot hang its servers' Close.
const GateTimeout = 20 * time.Second

func NewEffects() *Effects { return &Effects{runs: make(map[string]int)} }

func (e *Effects) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	op := string(body)
	e.mu.Lock()
	e.runs[op]++
	n := e.runs[op]
	gate, started := e.gate, e.started
	e.mu.Unlock()
	if started != nil {
		started <- op
	}
	if gate != nil {
		select {
		case <-gate:
		case <-time.After(GateTimeout):
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"op":%q,"run":%d}`, op, n)
}

// Hold makes every later run wait until the returned release is called,
// announcing itself on the returned channel (buffered for n runs).
func (e *Effects) Hold(n int) (started <-chan string, release func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	gate, ch := make(chan struct{}), make(chan string, n)
	e.gate, e.started = gate, ch
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			e.mu.Lock()
			e.gate, e.started = nil, nil
			e.mu.Unlock()
			close(gate)
		})
	}
}

func (e *Effects) Count(op string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[op]
}

// Serve starts a server running e behind a Middleware on store, scoped by
// the X-Tenant header, and closes it when the test ends. It answers 409
// and 503 with "Retry-After: 0", and logs store errors to log.
func Serve(t *testing.T, store idemserver.Store, e *Effects, lockTimeout time.Duration, log io.Writer) *httptest.Server {
	t.Helper()
	if log == nil {
		log = io.Discard
	}
	mw := &idemserver.Middleware{
		Store:       store,
		Principal:   func(r *http.Request) string { return r.Header.Get("X-Tenant") },
		Required:    true,
		LockTimeout: lockTimeout,
		RetryAfter:  -1,
		Logger:      slog.New(slog.NewTextHandler(log, nil)),
	}
	srv := httptest.NewServer(mw.Wrap(e))
	t.Cleanup(srv.Close)
	return srv
}

// Reply is what a request got back.
type Reply struct {
	Status   int
	Replayed bool
	Body     string // the response body; for problems, the problem type
	Err      error
}

// Post sends op with key for tenant to srv.
func Post(srv *httptest.Server, tenant, key, op string) Reply {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(op))
	if err != nil {
		return Reply{Err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", tenant)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return Reply{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	r := Reply{Status: resp.StatusCode, Replayed: resp.Header.Get(idemserver.ReplayedHeader) == "true", Body: string(body), Err: err}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p idemserver.Problem
		if json.Unmarshal(body, &p) == nil {
			r.Body = p.Type
		}
	}
	return r
}

// Created is the body the first run of op answers.
func Created(op string, run int) string { return fmt.Sprintf(`{"op":%q,"run":%d}`, op, run) }

// SyncBuffer is a log destination safe for concurrent writers.
type SyncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// SharedKeyRace sends n requests with one key at once, spread over the
// servers, while the first run is held until every other request has been
// answered; then sends one more to each server. It checks that the effect
// ran once, that every other request in the race got 409, and that the
// later ones got the first response replayed.
func SharedKeyRace(t *testing.T, servers []*httptest.Server, e *Effects, n int) {
	t.Helper()
	started, release := e.Hold(n)
	defer release()
	replies := make(chan Reply, n)
	for i := range n {
		go func() { replies <- Post(servers[i%len(servers)], "tenant", "the-key", "op-race") }()
	}
	select {
	case <-started:
	case <-time.After(GateTimeout):
		require.FailNow(t, "no request ran the handler")
	}
	var got []Reply
	timeout := time.After(GateTimeout)
collect:
	for len(got) < n-1 {
		select {
		case r := <-replies:
			got = append(got, r)
		case <-timeout:
			break collect // a second run is holding a request: the count below fails
		}
	}
	release()
	for len(got) < n {
		got = append(got, <-replies)
	}

	statuses := map[int]int{}
	for _, r := range got {
		require.NoError(t, r.Err)
		statuses[r.Status]++
	}
	require.Equal(t, 1, e.Count("op-race"), "the effect must run exactly once")
	require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusConflict: n - 1}, statuses)
	for _, srv := range servers {
		r := Post(srv, "tenant", "the-key", "op-race")
		require.NoError(t, r.Err)
		require.Equal(t, Reply{Status: http.StatusCreated, Replayed: true, Body: Created("op-race", 1)}, r)
	}
}
