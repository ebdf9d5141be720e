package postgres_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/storeharness"
)

// TestTxLogsTheKeyOnlyWithRecordKey: TxMiddleware's log names a key by
// its digest, and by itself only with Hooks.RecordKey, as
// idemserver.Middleware's does: here a Principal that names nobody (500)
// and a handler error (logged, then rolled back), paths TestTxLogs does
// not walk.
//
// Checked to fail with logKeys always false (the key missing under
// RecordKey), and with the empty-scope line logging "key", key.
func TestTxLogsTheKeyOnlyWithRecordKey(t *testing.T) {
	serverURL(t)
	const key = "op-7f3a-9c1d-not-for-logs"
	for _, record := range []bool{false, true} {
		t.Run(fmt.Sprintf("RecordKey=%v", record), func(t *testing.T) {
			var log storeharness.SyncBuffer
			m := newTx(t, newTxSchema(t), 4, &postgres.TxOptions{
				Principal: func(r *http.Request) string { return r.Header.Get("X-Tenant") },
				Logger:    slog.New(slog.NewTextHandler(&log, nil)),
				Hooks:     &idemserver.Hooks{RecordKey: record},
			})
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				return errors.New("the handler's own failure")
			})
			assert.Equal(t, http.StatusInternalServerError, post(t, h, key, "x").Status, "no X-Tenant: no scope")
			req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set("X-Tenant", "acme")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			assert.Equal(t, http.StatusInternalServerError, w.Code, "the handler's error: rolled back")

			out := log.String()
			assert.Contains(t, out, "empty scope")
			assert.Contains(t, out, "handler failed")
			assert.Contains(t, out, "rolled back")
			assert.Equal(t, 3, strings.Count(out, "key_digest="+idemserver.KeyDigest(key)), out)
			if record {
				assert.Equal(t, 3, strings.Count(out, "key="+key), out)
			} else {
				assert.NotContains(t, out, key)
			}
		})
	}
}
