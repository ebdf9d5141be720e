package idemserver_test

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// The fresh-eyes attack on the server half (issue 30): each test is named
// after the bug it pins.

// TestShouldStorePanicRunsTheHandlerAgain: a ShouldStore that panics
// after the handler ran (its effect done, its response sent) left the
// key claimed, its renewals stopped: once the lock timed out a retry ran
// the handler a second time. Now the key is kept completed, not
// replayable: a retry gets 410.
//
// Checked to fail with run's deferred Unjudged finish removed.
func TestShouldStorePanicRunsTheHandlerAgain(t *testing.T) {
	const lock = 200 * time.Millisecond
	var (
		runs  atomic.Int64
		armed atomic.Bool
	)
	armed.Store(true)
	h := (&idemserver.Middleware{
		SingleTenant: true, LockTimeout: lock, RetryAfter: -1, Logger: slog.New(slog.DiscardHandler),
		ShouldStore: func(status int) bool {
			if armed.CompareAndSwap(true, false) {
				panic("should-store bug")
			}
			return idemserver.DefaultShouldStore(status)
		},
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	require.Panics(t, func() { serve(h, req{key: "k"}) })
	<-time.After(2 * lock) // past the claim's lock
	got := serve(h, req{key: "k"}).Code
	assert.Equal(t, int64(1), runs.Load(), "the handler ran again (answered %d)", got)
	assert.Equal(t, http.StatusGone, got)
}

// TestOnClaimPanicHoldsTheKey: an OnClaim hook that panics for a new key
// (before the handler runs) left the key claimed, unrenewed, until its
// lock timed out: every retry meanwhile got 409 although nothing ran.
//
// Checked to fail with the OnClaim call moved back before run's deferred
// release.
func TestOnClaimPanicHoldsTheKey(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	var runs atomic.Int64
	h := (&idemserver.Middleware{
		SingleTenant: true, LockTimeout: time.Hour, RetryAfter: -1, Logger: slog.New(slog.DiscardHandler),
		Hooks: &idemserver.Hooks{OnClaim: func(_ context.Context, ev idemserver.ClaimEvent) {
			if ev.Outcome == idemserver.ClaimNew && armed.CompareAndSwap(true, false) {
				panic("metrics exporter bug")
			}
		}},
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	require.Panics(t, func() { serve(h, req{key: "k"}) })
	assert.Zero(t, runs.Load())
	assert.Equal(t, http.StatusCreated, serve(h, req{key: "k"}).Code, "the key is free: nothing ran")
}

// TestPanicAfterWritingRunsTheHandlerAgain: a Streamed handler that did
// its effect, sent its whole 201 (flushed, Content-Length set) and then
// panicked (a deferred audit log, say) released its key: the client got
// its complete answer, and the next request with the key (a user's second
// click, a client's Resume) ran the effect a second time. The effect
// evidently ran: fail closed keeps the key completed, not replayable, as
// a hijack's is kept (core rule 2). Checked to fail with rule 2's case
// for a panic after the answer removed: the handler ran twice.
func TestPanicAfterWritingRunsTheHandlerAgain(t *testing.T) {
	var runs atomic.Int64
	h := (&idemserver.Middleware{SingleTenant: true, Logger: slog.New(slog.DiscardHandler)}).Wrap(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("ok"))
			http.NewResponseController(w).Flush()
			panic("audit log bug") // after the answer
		}))
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
	srv.Start()
	defer srv.Close()
	send := func() (int, string, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Idempotency-Key", "k")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	status, body, err := send()
	require.NoError(t, err, "the client got its whole answer")
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, "ok", body)
	status, _, _ = send()
	assert.Equal(t, int64(1), runs.Load(), "the effect ran again (answered %d)", status)
}
