package postgres_test

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

// effects is a handler whose side effect is counted: each run of an
// operation (the request body) increments its count, and the response
// names the operation and the run, so that a replay to the wrong caller
// shows.
type effects struct {
	mu      sync.Mutex
	runs    map[string]int
	gate    chan struct{} // when not nil, each run waits for it to close
	started chan string   // when not nil, receives the operation as a run starts
}

// gateTimeout bounds a run's wait for its gate, so that a failing test
// cannot hang its servers' Close.
const gateTimeout = 20 * time.Second

func newEffects() *effects { return &effects{runs: make(map[string]int)} }

func (e *effects) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		case <-time.After(gateTimeout):
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"op":%q,"run":%d}`, op, n)
}

// hold makes every later run wait until the returned release is called,
// announcing itself on the returned channel (buffered for n runs).
func (e *effects) hold(n int) (started <-chan string, release func()) {
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

func (e *effects) count(op string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[op]
}

// serve starts a server running e behind a Middleware on store, scoped by
// the X-Tenant header, and closes it when the test ends. It answers 409
// and 503 with "Retry-After: 0", and logs store errors to log.
func serve(t *testing.T, store idemserver.Store, e *effects, lockTimeout time.Duration, log io.Writer) *httptest.Server {
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

// reply is what a request got back.
type reply struct {
	status   int
	replayed bool
	body     string // the response body; for problems, the problem type
	err      error
}

// post sends op with key for tenant to srv.
func post(srv *httptest.Server, tenant, key, op string) reply {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(op))
	if err != nil {
		return reply{err: err}
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant", tenant)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, replayed: resp.Header.Get(idemserver.ReplayedHeader) == "true", body: string(body), err: err}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		var p idemserver.Problem
		if json.Unmarshal(body, &p) == nil {
			r.body = p.Type
		}
	}
	return r
}

// created is the body the first run of op answers.
func created(op string, run int) string { return fmt.Sprintf(`{"op":%q,"run":%d}`, op, run) }

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sharedKeyRace sends n requests with one key at once, spread over the
// servers, while the first run is held until every other request has been
// answered; then sends one more to each server. It checks that the effect
// ran once, that every other request in the race got 409, and that the
// later ones got the first response replayed.
func sharedKeyRace(t *testing.T, servers []*httptest.Server, e *effects, n int) {
	t.Helper()
	started, release := e.hold(n)
	defer release()
	replies := make(chan reply, n)
	for i := range n {
		go func() { replies <- post(servers[i%len(servers)], "tenant", "the-key", "op-race") }()
	}
	select {
	case <-started:
	case <-time.After(gateTimeout):
		require.FailNow(t, "no request ran the handler")
	}
	var got []reply
	timeout := time.After(gateTimeout)
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
		require.NoError(t, r.err)
		statuses[r.status]++
	}
	require.Equal(t, 1, e.count("op-race"), "the effect must run exactly once")
	require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusConflict: n - 1}, statuses)
	for _, srv := range servers {
		r := post(srv, "tenant", "the-key", "op-race")
		require.NoError(t, r.err)
		require.Equal(t, reply{status: http.StatusCreated, replayed: true, body: created("op-race", 1)}, r)
	}
}
