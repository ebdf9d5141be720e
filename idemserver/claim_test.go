package idemserver_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// blockingApp holds each request until released, reporting its start.
type blockingApp struct {
	calls   atomic.Int64
	started chan int64    // receives the call number as each call starts
	release chan struct{} // closed to let every call finish
}

func newBlockingApp() *blockingApp {
	return &blockingApp{started: make(chan int64, 8), release: make(chan struct{})}
}

func (a *blockingApp) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := a.calls.Add(1)
	a.started <- n
	<-a.release
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "call %d", n)
}

func TestInProgress(t *testing.T) {
	tests := []struct {
		name string
		give time.Duration // Middleware.RetryAfter
		want string        // Retry-After
	}{
		{"default", 0, "1"},
		{"rounded up", 1500 * time.Millisecond, "2"},
		{"negative sends zero", -1, "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newBlockingApp()
			h := (&idemserver.Middleware{SingleTenant: true, RetryAfter: tt.give}).Wrap(a)
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- serve(h, req{key: "k1", body: "x"}) }()
			<-a.started

			w := serve(h, req{key: "k1", body: "x"})
			mismatch := serve(h, req{key: "k1", body: "other"})
			close(a.release)
			assert.Equal(t, http.StatusCreated, (<-first).Code)

			assert.Equal(t, http.StatusConflict, w.Code)
			assert.Equal(t, idemserver.TypeInProgress, problemType(w))
			assert.Equal(t, tt.want, w.Header().Get("Retry-After"))
			assert.Equal(t, http.StatusUnprocessableEntity, mismatch.Code, "a mismatch is reported even while the first runs")
			assert.Equal(t, int64(1), a.calls.Load())
		})
	}
}

// TestConcurrentRequestsRunOnce sends 100 requests with one key and body
// at once over a loopback server: the handler runs once, the other 99 get
// 409 while it runs, and the next request gets the replay.
func TestConcurrentRequestsRunOnce(t *testing.T) {
	const n = 100
	a := newBlockingApp()
	srv := httptest.NewServer((&idemserver.Middleware{SingleTenant: true, Required: true}).Wrap(a))
	defer srv.Close()
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = n

	type result struct {
		status   int
		replayed bool
		body     string
		err      error
	}
	send := func() result {
		r, err := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
		if err != nil {
			return result{err: err}
		}
		r.Header.Set("Idempotency-Key", "one-key")
		resp, err := client.Do(r)
		if err != nil {
			return result{err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return result{status: resp.StatusCode, replayed: resp.Header.Get(idemserver.ReplayedHeader) == "true", body: string(b), err: err}
	}

	results := make(chan result, n)
	for range n {
		go func() { results <- send() }()
	}
	<-a.started // one request holds the claim; the others cannot run
	statuses := map[int]int{}
	for range n - 1 {
		r := <-results
		require.NoError(t, r.err)
		statuses[r.status]++
	}
	close(a.release)
	winner := <-results
	require.NoError(t, winner.err)
	replay := send()
	require.NoError(t, replay.err)

	assert.Equal(t, map[int]int{http.StatusConflict: n - 1}, statuses)
	assert.Equal(t, http.StatusCreated, winner.status)
	assert.False(t, winner.replayed)
	assert.Equal(t, http.StatusCreated, replay.status)
	assert.True(t, replay.replayed)
	assert.Equal(t, winner.body, replay.body)
	assert.Equal(t, int64(1), a.calls.Load(), "the handler ran exactly once")
}

func TestTTLExpiry(t *testing.T) {
	clk := newFakeClock()
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true, Store: &idemserver.MemoryStore{Now: clk.Now}, TTL: time.Hour}).Wrap(a)
	q := req{key: "k1", body: "x"}

	serve(h, q)
	clk.Advance(59 * time.Minute)
	within := serve(h, q)
	clk.Advance(2 * time.Minute)
	after := serve(h, q)

	assert.Equal(t, "true", within.Header().Get(idemserver.ReplayedHeader))
	assert.Empty(t, after.Header().Get(idemserver.ReplayedHeader), "the key expired, so it ran again")
	assert.Equal(t, int64(2), a.calls.Load())
}

func TestDefaultTTLIsADay(t *testing.T) {
	clk := newFakeClock()
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true, Store: &idemserver.MemoryStore{Now: clk.Now}}).Wrap(a)
	q := req{key: "k1", body: "x"}

	serve(h, q)
	clk.Advance(23 * time.Hour)
	within := serve(h, q)
	clk.Advance(2 * time.Hour)
	serve(h, q)

	assert.Equal(t, "true", within.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(2), a.calls.Load())
}

// TestLockTimeoutTakeover: a claim abandoned past LockTimeout is taken over,
// and the stale request, when it finally ends, cannot overwrite the newer
// request's stored response.
func TestLockTimeoutTakeover(t *testing.T) {
	clk := newFakeClock()
	a := newBlockingApp()
	var logs bytes.Buffer
	h := (&idemserver.Middleware{
		SingleTenant: true,
		Store:        &idemserver.MemoryStore{Now: clk.Now},
		LockTimeout:  time.Minute,
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	}).Wrap(a)
	q := req{key: "k1", body: "x"}

	stale := make(chan *httptest.ResponseRecorder)
	go func() { stale <- serve(h, q) }()
	<-a.started
	blocked := serve(h, q)
	clk.Advance(2 * time.Minute)
	fresh := make(chan *httptest.ResponseRecorder)
	go func() { fresh <- serve(h, q) }()
	<-a.started
	close(a.release)
	staleW, freshW := <-stale, <-fresh
	replay := serve(h, q)

	assert.Equal(t, http.StatusConflict, blocked.Code)
	assert.Equal(t, "call 1", staleW.Body.String(), "the stale request still answers its client")
	assert.Equal(t, "call 2", freshW.Body.String())
	assert.Equal(t, "true", replay.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, "call 2", replay.Body.String(), "the newer claim's response is the one stored")
	assert.Equal(t, int64(2), a.calls.Load())
	assert.Contains(t, logs.String(), "response not stored")
}

// TestConcurrentDistinctKeys exercises the store's shards under -race.
func TestConcurrentDistinctKeys(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(a)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				q := req{key: fmt.Sprintf("k-%d-%d", g, i), body: "x"}
				serve(h, q)
				serve(h, q)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(8*50), a.calls.Load())
}
