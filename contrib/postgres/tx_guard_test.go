package postgres_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// TestTxEmptyPrincipalRefused: a keyed request whose Principal returns ""
// is answered 500 and runs nothing, and setting both Principal and
// SingleTenant is refused. (Checked to fail with the check removed: the
// two anonymous requests shared one key, the second got the first's
// charge replayed.)
func TestTxEmptyPrincipalRefused(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{Principal: func(r *http.Request) string { return r.Header.Get("X-Account") }, Logger: discardLogger()})
	h := m.WrapFunc(chargeTx)
	for range 2 {
		got := post(t, h, "k", "x")
		assert.Equal(t, http.StatusInternalServerError, got.Status)
		assert.Contains(t, got.Body, idemserver.TypeNoPrincipal)
		assert.False(t, got.Replayed)
	}
	assert.Empty(t, charges(t, s, "k"))

	_, err := postgres.NewTxMiddleware(context.Background(), s.pool(t, 1), &postgres.TxOptions{
		SingleTenant: true, Principal: func(*http.Request) string { return "a" }})
	require.Error(t, err)
	assert.ErrorContains(t, err, "both")
}

// TestTxExtremeLimits: MaxBodyBytes and MaxStoredBody at the largest
// values their types hold serve a request of unknown length without a
// panic. (Checked to fail with idemserver.ReadBody's limit+1 restored:
// "makeslice: cap out of range".)
func TestTxExtremeLimits(t *testing.T) {
	s := newTxSchema(t)
	h := newTx(t, s, 2, &postgres.TxOptions{MaxBodyBytes: math.MaxInt64, MaxStoredBody: math.MaxInt}).WrapFunc(chargeTx)
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("amount=1"))
	req.ContentLength = -1
	req.Header.Set("Idempotency-Key", "k")
	rec := httptest.NewRecorder()
	require.NotPanics(t, func() { h.ServeHTTP(rec, req) })
	assert.Equal(t, http.StatusCreated, rec.Code)
	assert.Len(t, charges(t, s, "k"), 1)
}

// TestTxHeaderRulesIgnoreSpelling: a Set-Cookie, hop-by-hop or framing
// field the handler writes under a non-canonical name is not replayed.
// (Checked to fail with storedHeader comparing names as written: the
// replay carried "set-cookie".)
func TestTxHeaderRulesIgnoreSpelling(t *testing.T) {
	s := newTxSchema(t)
	h := newTx(t, s, 2, nil).WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header()["set-cookie"] = []string{"session=s3cr3t"}
		w.Header()["connection"] = []string{"x-private"}
		w.Header()["x-kept"] = []string{"yes"}
		return chargeTx(w, r, tx)
	})
	serveReq := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	first := serveReq()
	require.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, []string{"session=s3cr3t"}, first.Header()["set-cookie"])
	replay := serveReq()
	require.Equal(t, "true", replay.Header().Get(idemserver.ReplayedHeader))
	assert.Nil(t, replay.Header()["set-cookie"])
	assert.Nil(t, replay.Header()["connection"])
	assert.Equal(t, []string{"yes"}, replay.Header()["x-kept"])
}

// TestTxSwitchingProtocols: a handler that answers 101 (which cannot wait
// for the commit; Hijack is not offered) is rolled back, so that nothing
// ran and its key is free. (Checked to fail with 101 dropped like other
// 1xx, as before: an empty 200 was committed with the charge and
// replayed.)
func TestTxSwitchingProtocols(t *testing.T) {
	s := newTxSchema(t)
	m := newTx(t, s, 2, &postgres.TxOptions{Logger: discardLogger()})
	var hijackErr error
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := chargeTx(httptest.NewRecorder(), r, tx); err != nil {
			return err
		}
		w.Header().Set("Upgrade", "example/1")
		w.WriteHeader(http.StatusSwitchingProtocols)
		_, _, hijackErr = http.NewResponseController(w).Hijack()
		return nil
	})
	got := post(t, h, "k", "x") // ServeHTTP on this goroutine
	assert.ErrorIs(t, hijackErr, http.ErrNotSupported)
	assert.Equal(t, http.StatusInternalServerError, got.Status)
	assert.Contains(t, got.Body, postgres.TypeRolledBack)
	assert.Empty(t, charges(t, s, "k"))
	assert.Equal(t, http.StatusCreated, post(t, m.WrapFunc(chargeTx), "k", "x").Status, "the key is free")
}

// TestTxSchemasDoNotShareLocks: two applications in separate schemas of
// one database (the layout the package recommends) never block each
// other: a request with key k in one runs while one with k in the other
// holds its claim. (Checked to fail with the advisory lock on a hash of
// the key alone: the second got 409 until the first finished.)
func TestTxSchemasDoNotShareLocks(t *testing.T) {
	billing, payouts := newTxSchema(t), newTxSchema(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	slow := newTx(t, billing, 2, nil).WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		close(entered)
		<-release
		return chargeTx(w, r, tx)
	})
	first := make(chan reply, 1)
	go func() { first <- post(t, slow, "k", "x") }()
	<-entered
	other := post(t, newTx(t, payouts, 2, nil).WrapFunc(chargeTx), "k", "x")
	close(release)
	assert.Equal(t, http.StatusCreated, other.Status, "the other schema's key is its own")
	assert.Equal(t, http.StatusCreated, (<-first).Status)
	assert.Len(t, charges(t, billing, "k"), 1)
	assert.Len(t, charges(t, payouts, "k"), 1)
}

// TestTxNeedsTheKeyTable: NewTxMiddleware refuses a database whose
// search_path has no idemhttp_keys table, rather than scope its locks to
// a table it cannot name.
func TestTxNeedsTheKeyTable(t *testing.T) {
	s := newSchema(t)
	pool := s.pool(t, 1)
	_, err := pool.Exec(context.Background(), "DROP TABLE idemhttp_keys")
	require.NoError(t, err)
	_, err = postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true})
	assert.ErrorContains(t, err, "Migrate")
}
