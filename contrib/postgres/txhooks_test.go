package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// recordedHooks records TxMiddleware's events as short strings.
type recordedHooks struct {
	mu     sync.Mutex
	events []string
	keys   []string
}

func (h *recordedHooks) add(ev idemserver.RequestEvent, s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, s)
	h.keys = append(h.keys, ev.Key)
}

func (h *recordedHooks) hooks() *idemserver.Hooks {
	return &idemserver.Hooks{
		RecordKey: true,
		OnClaim: func(_ context.Context, ev idemserver.ClaimEvent) {
			h.add(ev.RequestEvent, fmt.Sprintf("claim:%s:%d", ev.Outcome, ev.Status))
		},
		OnStored: func(_ context.Context, ev idemserver.StoredEvent) {
			h.add(ev.RequestEvent, fmt.Sprintf("stored:%d", ev.Status))
		},
		OnReleased: func(_ context.Context, ev idemserver.ReleasedEvent) {
			h.add(ev.RequestEvent, fmt.Sprintf("released:%s:%d", ev.Reason, ev.Status))
		},
		OnStoreError: func(_ context.Context, ev idemserver.StoreErrorEvent) {
			h.add(ev.RequestEvent, fmt.Sprintf("store_error:%s", ev.Op))
		},
	}
}

func (h *recordedHooks) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.events
	h.events = nil
	return out
}

// TxMiddleware tells its hooks of each keyed request's claim and of how it
// ended, as idemserver.Middleware does; a request without a key reports
// nothing. (Checked to fail with each report call removed in turn.)
func TestTxHooks(t *testing.T) {
	s := newTxSchema(t)
	rec := &recordedHooks{}
	m := newTx(t, s, 4, &postgres.TxOptions{Hooks: rec.hooks(), Logger: discardLogger()})
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		switch r.Header.Get("X-Case") {
		case "error":
			_ = chargeTx(w, r, tx)
			return errors.New("declined")
		case "5xx":
			w.WriteHeader(http.StatusBadGateway)
			return nil
		case "panic":
			panic("handler bug")
		}
		return chargeTx(w, r, tx)
	})
	send := func(key, body, c string) {
		defer func() { _ = recover() }()
		req := postRequest(key, body)
		if c != "" {
			req.Header.Set("X-Case", c)
		}
		serve(h, req)
	}

	send("k1", "amount=1", "")
	assert.Equal(t, []string{"claim:new:0", "stored:201"}, rec.take())
	send("k1", "amount=1", "")
	assert.Equal(t, []string{"claim:replay:201"}, rec.take())
	send("k1", "amount=2", "")
	assert.Equal(t, []string{"claim:mismatch:422"}, rec.take())
	send("k2", "amount=1", "error")
	assert.Equal(t, []string{"claim:new:0", "released:rolled_back:201"}, rec.take())
	send("k3", "amount=1", "5xx")
	assert.Equal(t, []string{"claim:new:0", "released:server_error:502"}, rec.take())
	send("k4", "amount=1", "panic")
	assert.Equal(t, []string{"claim:new:0", "released:panic:0"}, rec.take())
	send("", "amount=1", "")
	assert.Empty(t, rec.take(), "a request without a key reports nothing")
	rec.mu.Lock()
	assert.Contains(t, rec.keys, "k4", "RecordKey puts the key in the event")
	rec.mu.Unlock()
}

func postRequest(key, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	return req
}

func serve(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
