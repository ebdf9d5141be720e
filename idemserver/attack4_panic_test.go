package idemserver_test

import (
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// The fresh-eyes attack on the last fixes of the previous session
// (attack4): each test is named after the bug it pins.

// TestPanicAfterWritingWithShouldStorePanicRunsTwice: a handler that
// wrote its 201 (its effect done) and then panicked goes through core
// rule 2, which asks the server author's ShouldStore whether the status
// is one it keeps. A ShouldStore that panics there, inside the deferred
// finish of a panicking handler, left the key claimed with its renewals
// stopped: once the lock timed out, a retry ran the handler a second
// time. Now the panic path judges no status it cannot judge safely: a
// ShouldStore that panics there counts as Unjudged, the key is kept
// completed, not replayable (410).
//
// Checked to fail with rule 2 calling shouldStore instead of
// keepsOrPanics (internal/servercore): the handler ran twice.
func TestPanicAfterWritingWithShouldStorePanicRunsTwice(t *testing.T) {
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
		if runs.Add(1) == 1 {
			w.WriteHeader(http.StatusCreated)
			panic("audit log bug") // after the answer
		}
		w.WriteHeader(http.StatusCreated)
	}))
	require.Panics(t, func() { serve(h, req{key: "k"}) })
	<-time.After(2 * lock) // past the claim's lock
	got := serve(h, req{key: "k"}).Code
	assert.Equal(t, int64(1), runs.Load(), "the handler ran again (answered %d)", got)
	assert.Equal(t, http.StatusGone, got)
}

// TestLogsWithholdTheKeyAsHooksDo: the Hooks withhold the idempotency
// key unless RecordKey allows it ("a key names one operation whose stored
// response it can fetch"), but the Logger gets it at Error level with
// every store failure (and TxMiddleware's, Redis's log lines alike: 17
// sites write "key"). The two promises disagree; the logs are where a
// key is likeliest to be read by someone it was not meant for.
//
// Not fixed: whether a key is a secret is the lead's call (withhold it in
// logs as in hooks, or say in Hooks' doc that logs carry it). Without
// the skip it fails: the log line holds the key.
func TestLogsWithholdTheKeyAsHooksDo(t *testing.T) {
	t.Skip("attack4: the Logger gets the idempotency key that Hooks withhold unless RecordKey")
	var buf strings.Builder
	h := (&idemserver.Middleware{
		SingleTenant: true, RetryAfter: -1,
		Store:  &faultStore{MemoryStore: new(idemserver.MemoryStore), claimErr: errDown},
		Logger: slog.New(slog.NewTextHandler(&buf, nil)),
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	assert.Equal(t, http.StatusServiceUnavailable, serve(h, req{key: "op-7f3a-secret-ish"}).Code)
	assert.NotContains(t, buf.String(), "op-7f3a-secret-ish")
}
