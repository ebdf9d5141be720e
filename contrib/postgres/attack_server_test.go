package postgres_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// The fresh-eyes attack on the server half (issue 30): each test is named
// after the bug it pins.

// TestTxCallbackPanicLeaksTheTransaction: a panic in one of the server
// author's callbacks that TxMiddleware calls while the request's
// transaction is open (OnClaim for a new key, before the handler runs;
// ShouldStore, after it returned) went on to net/http with the
// transaction open and its pooled connection never released: the key's
// lock was held for as long as the process lived (every retry 409), each
// such request took one connection out of the pool for good (the next
// requests waited DBTimeout and got 503), and closing the pool hung.
//
// Checked to fail with serve's deferred rollback of a run left open
// removed (both cases; ShouldStore's now also passes through runOnce's
// Unjudged path, so it fails only with both removed).
func TestTxCallbackPanicLeaksTheTransaction(t *testing.T) {
	tests := []struct {
		name string
		give func(*postgres.TxOptions, *atomic.Bool)
	}{
		{"OnClaim", func(o *postgres.TxOptions, armed *atomic.Bool) {
			o.Hooks = &idemserver.Hooks{OnClaim: func(_ context.Context, ev idemserver.ClaimEvent) {
				if ev.Outcome == idemserver.ClaimNew && armed.CompareAndSwap(true, false) {
					panic("metrics exporter bug")
				}
			}}
		}},
		{"ShouldStore", func(o *postgres.TxOptions, armed *atomic.Bool) {
			o.ShouldStore = func(status int) bool {
				if armed.CompareAndSwap(true, false) {
					panic("should-store bug")
				}
				return idemserver.DefaultShouldStore(status)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTxSchema(t)
			var armed atomic.Bool
			armed.Store(true)
			opts := &postgres.TxOptions{SingleTenant: true, DBTimeout: 2 * time.Second, Logger: discardLogger()}
			tt.give(opts, &armed)
			pool := leakablePool(t, s, 1)
			m, err := postgres.NewTxMiddleware(context.Background(), pool, opts)
			require.NoError(t, err)
			h := m.WrapFunc(chargeTx)
			require.Panics(t, func() { post(t, h, "k", "x") })
			assert.Empty(t, charges(t, s, "k"), "nothing committed")

			// The pool's one connection is back, and the key is free:
			// the panicked request committed nothing.
			assert.Equal(t, http.StatusCreated, post(t, h, "k", "x").Status)
			assert.Equal(t, http.StatusCreated, post(t, h, "k2", "x").Status)
			assert.Len(t, charges(t, s, "k"), 1)
		})
	}
}

// leakablePool is s.pool for a test of a connection leak: when the test
// ends with a connection still acquired, the test fails rather than hang
// in pool.Close, which waits for every connection to come back.
func leakablePool(t *testing.T, s *testSchema, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%d connections never released", n)
			// End their sessions, which hold the schema's locks, so that
			// the schema can be dropped.
			admin := s.admin(t)
			_, err := admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", s.name)
			assert.NoError(t, err)
			go pool.Close() // never returns: goleak reports it too
			return
		}
		pool.Close()
	})
	return pool
}

// TestRecoveryPointOutlivesItsRequest: a recovery point is kept by key
// alone, not with the request that saved it. After the first run of a key
// paid for body "x" and rolled back (its key released, nothing of the
// request's fingerprint kept), the same key sent with body "y" is a new
// request to the middleware, but its handler resumes from the point "x"
// saved: it skips the payment "y" asked for and commits "y" as paid with
// "x"'s payment. Atomic phases as Brandur Leach's rocket-rides keeps them
// store the request's parameters with the recovery point and refuse a
// mismatch; here the points are saved under the key and the request's
// fingerprint, so y starts from its own beginning. Checked to fail with
// pointKey returning the key alone: y was answered with x's payment.
func TestRecoveryPointOutlivesItsRequest(t *testing.T) {
	s := newTxSchema(t)
	pool := s.pool(t, 4)
	m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
	var (
		mu       sync.Mutex
		payments []string // the other service's runs, by what they paid
		failOnce = true
	)
	h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		k, _ := postgres.KeyFromContext(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		paid, ok, err := postgres.LoadRecoveryPoint(r.Context(), tx, k, "paid")
		if err != nil {
			return err
		}
		if !ok {
			mu.Lock()
			payments = append(payments, string(body))
			mu.Unlock()
			paid = body
			if err := postgres.SaveRecoveryPoint(r.Context(), pool, k, "paid", paid); err != nil {
				return err
			}
		}
		if failOnce {
			failOnce = false
			return errors.New("crashed after paying")
		}
		if err := postgres.ClearRecoveryPoints(r.Context(), tx, k); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		_, err = w.Write(paid)
		return err
	})
	require.Equal(t, http.StatusInternalServerError, post(t, h, "k", "x").Status)
	got := post(t, h, "k", "y")
	if got.Status == http.StatusCreated {
		assert.Equal(t, "y", got.Body, "the request for y was answered with x's payment")
		assert.Equal(t, []string{"x", "y"}, payments, "y was never paid")
	} else {
		assert.Equal(t, http.StatusUnprocessableEntity, got.Status, "the key is bound to x's request")
	}
}

// TestStoreClaimWaitsForARunningTxHandler: a Store sharing the key table
// with TxMiddleware (TestTxSharesTheStoresTable; two services on one
// database, or a deploy moving from one to the other) claimed a key whose
// TxMiddleware handler was running by inserting over the handler's
// uncommitted claim row, so its Claim waited for the handler's
// transaction to end: a duplicate on the Store's side held a connection
// and got no answer for as long as the handler ran (by default up to the
// lock timeout, a minute, then 503), where TxMiddleware's own duplicates
// get 409 at once.
//
// Checked to fail with storeClaim's advisory lock try removed.
func TestStoreClaimWaitsForARunningTxHandler(t *testing.T) {
	s := newTxSchema(t)
	entered, proceed := make(chan struct{}), make(chan struct{})
	h := newTx(t, s, 2, &postgres.TxOptions{Logger: discardLogger()}).WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		close(entered)
		<-proceed
		return chargeTx(w, r, tx)
	})
	done := make(chan reply, 1)
	go func() { done <- post(t, h, "k", "x") }()
	<-entered
	defer func() {
		close(proceed)
		assert.Equal(t, http.StatusCreated, (<-done).Status)
	}()

	store := newStore(t, s.pool(t, 1))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
	started := time.Now()
	res, err := store.Claim(ctx, idemserver.ScopedKey("", "k"),
		idemserver.Claim{Token: "other", Fingerprint: idemserver.DefaultFingerprint(req, []byte("x")), LockTimeout: time.Minute})
	require.NoError(t, err, "the Store's claim waited %v for the running handler", time.Since(started).Round(time.Millisecond))
	assert.Equal(t, idemserver.InProgress, res.State)
}

// TestStoreClaimReplaysAnExpiredResponse: a Store's claim that finds the
// key's advisory lock taken (a TxMiddleware request taking over the
// key's expired row, its update not yet committed) writes nothing and
// reads the key's row as committed: the expired response, which it
// returned as Completed. The Store replayed a response past its TTL
// while the request it was a duplicate of ran the key afresh.
//
// Checked to fail with the lookup's liveness column ignored.
func TestStoreClaimReplaysAnExpiredResponse(t *testing.T) {
	ctx := context.Background()
	s := newTxSchema(t)
	tx, err := s.pool(t, 1).Begin(ctx)
	require.NoError(t, err)
	insertCompleted(t, tx, "k", `{"id":"stale"}`)
	_, err = tx.Exec(ctx, `UPDATE idemhttp_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	entered, proceed := make(chan struct{}), make(chan struct{})
	h := newTx(t, s, 2, &postgres.TxOptions{Logger: discardLogger()}).WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		close(entered)
		<-proceed
		return chargeTx(w, r, tx)
	})
	done := make(chan reply, 1)
	go func() { done <- post(t, h, "k", "x") }()
	<-entered
	defer func() {
		close(proceed)
		got := <-done
		assert.Equal(t, http.StatusCreated, got.Status)
		assert.False(t, got.Replayed, "the expired key ran afresh")
	}()

	store := newStore(t, s.pool(t, 1))
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x"))
	res, err := store.Claim(cctx, idemserver.ScopedKey("", "k"),
		idemserver.Claim{Token: "other2", Fingerprint: idemserver.DefaultFingerprint(req, []byte("x")), LockTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, idemserver.InProgress, res.State, "the key runs afresh; its expired response is not replayed")
}

// TestTxOwnPanicWhileClaimingFreesTheConnection: a panic in the
// middleware's own code while it holds a pooled connection for the claim
// (a decoder's bug, as the wire's replay of a large response once was)
// closed nothing: the connection stayed acquired, each retry took
// another, and on a one-connection pool every later request answered
// 503 and pool.Close hung. The claim now closes the connection it holds
// on a panic; the panic goes on. Checked to fail with claimOnce's
// deferred close removed (the second request waited for the pool and got
// 503; the cleanup reported a connection never released).
func TestTxOwnPanicWhileClaimingFreesTheConnection(t *testing.T) {
	s := newTxSchema(t)
	pool := leakablePool(t, s, 1)
	m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, DBTimeout: 2 * time.Second, Logger: discardLogger()})
	require.NoError(t, err)
	var armed atomic.Bool
	armed.Store(true)
	postgres.SetTxStepHook(m, func(step string) {
		if step == "claimed" && armed.CompareAndSwap(true, false) {
			panic("a bug of the middleware's own")
		}
	})
	h := m.WrapFunc(chargeTx)
	require.Panics(t, func() { post(t, h, "k", "x") })
	assert.Empty(t, charges(t, s, "k"), "nothing committed")
	assert.Equal(t, http.StatusCreated, post(t, h, "k", "x").Status, "the key is free and the pool has its connection")
	assert.Len(t, charges(t, s, "k"), 1)
}
