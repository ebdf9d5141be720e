package idemserver_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/storeharness"
)

// TestLogsNameTheKeyByDigestOnEveryPath: every path of the middleware that
// logs (beyond the shell suite's scenarios, which servertest.RunLogs
// scans) names the key by its digest, and by itself only with
// Hooks.RecordKey: a Principal that names nobody, a full store, a store
// that refuses the Complete after the handler (the key pinned) or the
// Release after a 500.
//
// Checked to fail with the "store full" line logging "key", key, and with
// the "release failed" line logging "key", f.key.
func TestLogsNameTheKeyByDigestOnEveryPath(t *testing.T) {
	const key = "op-7f3a-9c1d-not-for-logs"
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	tests := []struct {
		name       string
		give       req
		store      func() idemserver.Store // nil: the memory store
		principal  bool
		wantStatus int
		wantLine   string
	}{
		{name: "no principal", give: req{key: key}, principal: true, wantStatus: http.StatusInternalServerError, wantLine: "empty scope"},
		{name: "store full", give: req{key: key},
			store: func() idemserver.Store {
				return &faultStore{MemoryStore: new(idemserver.MemoryStore), claimErr: fmt.Errorf("full: %w", idemserver.ErrStoreFull)}
			},
			wantStatus: http.StatusServiceUnavailable, wantLine: "store full"},
		{name: "complete refused", give: req{key: key},
			store: func() idemserver.Store {
				return &faultStore{MemoryStore: new(idemserver.MemoryStore), completeErr: errDown}
			},
			wantStatus: http.StatusCreated, wantLine: "response not stored"},
		{name: "release refused", give: req{key: key, target: "/fail"},
			store:      func() idemserver.Store { return &faultStore{MemoryStore: new(idemserver.MemoryStore), relErr: errDown} },
			wantStatus: http.StatusInternalServerError, wantLine: "release failed"},
	}
	for _, tt := range tests {
		for _, record := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/RecordKey=%v", tt.name, record), func(t *testing.T) {
				var log storeharness.SyncBuffer
				mw := &idemserver.Middleware{
					RetryAfter: -1, LockTimeout: 100 * time.Millisecond,
					Logger: slog.New(slog.NewTextHandler(&log, nil)),
					Hooks:  &idemserver.Hooks{RecordKey: record},
				}
				if tt.store != nil {
					mw.Store = tt.store()
				}
				if tt.principal {
					mw.Principal = func(r *http.Request) string { return r.Header.Get("X-Tenant") }
				} else {
					mw.SingleTenant = true
				}
				assert.Equal(t, tt.wantStatus, serve(mw.Wrap(app), tt.give).Code)
				out := log.String()
				assert.Contains(t, out, tt.wantLine)
				assert.Contains(t, out, "key_digest="+idemserver.KeyDigest(key))
				if record {
					assert.Contains(t, out, "key="+key)
				} else {
					assert.NotContains(t, out, key)
				}
			})
		}
	}
}
