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
// response it can fetch"), but the Logger got it at Error level with
// every store failure (and TxMiddleware's, Redis's log lines alike: 17
// sites wrote "key"). Now a log record names the key by its digest
// (key_digest), and carries the key itself only with Hooks.RecordKey,
// the one switch for hooks and logs.
//
// Checked to fail with storeFailed's logKey(key) put back to
// "key", key: the log line held the key.
func TestLogsWithholdTheKeyAsHooksDo(t *testing.T) {
	const key = "op-7f3a-secret-ish"
	for _, tt := range []struct {
		name  string
		give  *idemserver.Hooks
		wantK bool
	}{
		{name: "default", give: nil},
		{name: "hooks without RecordKey", give: &idemserver.Hooks{RecordScope: true}},
		{name: "RecordKey", give: &idemserver.Hooks{RecordKey: true}, wantK: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var buf strings.Builder
			h := (&idemserver.Middleware{
				SingleTenant: true, RetryAfter: -1, Hooks: tt.give,
				Store:  &faultStore{MemoryStore: new(idemserver.MemoryStore), claimErr: errDown},
				Logger: slog.New(slog.NewTextHandler(&buf, nil)),
			}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
			assert.Equal(t, http.StatusServiceUnavailable, serve(h, req{key: key}).Code)
			assert.Contains(t, buf.String(), "key_digest="+idemserver.KeyDigest(key), "the line names the key by its digest")
			if tt.wantK {
				assert.Contains(t, buf.String(), "key="+key)
			} else {
				assert.NotContains(t, buf.String(), key)
			}
		})
	}
}
