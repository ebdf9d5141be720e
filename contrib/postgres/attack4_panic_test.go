package postgres_test

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

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// The fresh-eyes attack on the last fixes of the previous session
// (attack4): core rule 2 (a panic after the answer) over the PostgreSQL
// Store, and panics at each point of a TxMiddleware handler.

// TestPanicPointsOverPostgresStore: a handler panicking at each point
// of its response, its key in the PostgreSQL Store. Checked to fail with
// rule 2's case removed from servercore.Returned (every "after" point
// ran twice).
func TestPanicPointsOverPostgresStore(t *testing.T) {
	s := newSchema(t)
	pool := s.pool(t, 4)
	runPanicPoints(t, func(t *testing.T) idemserver.Store { return newStore(t, pool) })
}

// TestTxPanicPoints: a TxMiddleware handler that panics at each point of
// its run leaves at most one charge committed, whatever its retry does,
// and hands its connection back (the pool has none acquired after). A
// handler that committed its transaction itself (COMMIT, or COMMIT AND
// CHAIN then went on) before it panicked ran: its key must not run
// again, and is kept completed, not replayable (410), not left held until
// its lock runs out. Passes as it stands; checked to fail (409 for the
// three commit cases) with both rule 1's case in Returned and
// RolledBack's ended case removed.
func TestTxPanicPoints(t *testing.T) {
	for _, tt := range []struct {
		name string
		at   func(r *http.Request, tx pgx.Tx)
		want int // the retry's status: 201 ran afresh, 410 kept as run
	}{
		{"before anything", func(*http.Request, pgx.Tx) {}, http.StatusCreated},
		{"after the charge", func(r *http.Request, tx pgx.Tx) { insertCharge(r, tx) }, http.StatusCreated},
		{"after commit", func(r *http.Request, tx pgx.Tx) {
			insertCharge(r, tx)
			_, _ = tx.Exec(r.Context(), "COMMIT")
		}, http.StatusGone},
		{"after commit and chain", func(r *http.Request, tx pgx.Tx) {
			insertCharge(r, tx)
			_, _ = tx.Exec(r.Context(), "COMMIT AND CHAIN")
		}, http.StatusGone},
		{"after commit and chain and a statement", func(r *http.Request, tx pgx.Tx) {
			insertCharge(r, tx)
			_, _ = tx.Exec(r.Context(), "COMMIT AND CHAIN")
			_, _ = tx.Exec(r.Context(), "SELECT 1")
		}, http.StatusGone},
		{"after a failed statement", func(r *http.Request, tx pgx.Tx) {
			insertCharge(r, tx)
			_, _ = tx.Exec(r.Context(), "SELECT 1/0")
		}, http.StatusCreated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newTxSchema(t)
			pool := s.pool(t, 2)
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
			require.NoError(t, err)
			var runs atomic.Int64
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if runs.Add(1) == 1 {
					tt.at(r, tx)
					panic("after " + tt.name)
				}
				return chargeTx(w, r, tx)
			})
			require.Panics(t, func() { post(t, h, "k", "x") })
			got := post(t, h, "k", "x")
			assert.LessOrEqual(t, len(charges(t, s, "k")), 1, "the effect ran twice (the retry answered %d)", got.Status)
			assert.Equal(t, tt.want, got.Status)
			assert.Zero(t, pool.Stat().AcquiredConns(), "a connection is still acquired")
		})
	}
}

// TestTxOwnPanicWhileClaimingWithoutAcquire:
// TestTxOwnPanicWhileClaimingFreesTheConnection for a DB that is no
// pool (plainDB: the transaction begins through SendBatch, and the DB
// holds its connection): claimOnce's guard closes only a connection it
// acquired itself, so a panic at the "claimed" step left the claim's
// transaction open, its connection acquired for ever and the key's
// advisory lock held: every retry of the key waited for it.
//
// Checked to fail with claimOnce's stranded guard removed (never set):
// the retry got 409 (the leaked session held the key's lock) and a
// connection was never released.
func TestTxOwnPanicWhileClaimingWithoutAcquire(t *testing.T) {
	s := newTxSchema(t)
	pool := leakablePool(t, s, 2)
	m, err := postgres.NewTxMiddleware(context.Background(), plainDB{pool}, &postgres.TxOptions{SingleTenant: true, DBTimeout: 2 * time.Second, Logger: discardLogger()})
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

// insertCharge writes the charge chargeTx writes, without answering.
func insertCharge(r *http.Request, tx pgx.Tx) {
	k, _ := postgres.KeyFromContext(r.Context())
	_, _ = tx.Exec(r.Context(), `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, 1)`, k.Key)
}

// panicPoints are the points of a handler at which it panics, with what
// a retry of its key must get: a handler that panicked before it
// answered is released (the retry runs it), one that answered a status
// the middleware keeps, or took the connection, ran, and is kept
// completed, not replayable (410), whichever store holds its key (core
// rule 2).
var panicPoints = []struct {
	name   string
	at     func(w http.ResponseWriter)
	want   int // the retry's status
	wantRn int64
}{
	{"before writing", func(http.ResponseWriter) {}, http.StatusCreated, 2},
	{"after the header", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }, http.StatusGone, 1},
	{"after a flush", func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("ok"))
		_ = http.NewResponseController(w).Flush()
	}, http.StatusGone, 1},
	{"after a body without a header", func(w http.ResponseWriter) { _, _ = w.Write([]byte("ok")) }, http.StatusGone, 1},
	{"after a hijack", func(w http.ResponseWriter) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}, http.StatusGone, 1},
	{"after a 500", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }, http.StatusCreated, 2},
}

// runPanicPoints serves each panic point through idemserver.Middleware
// over the store newStore returns, on a real server (a hijack needs a
// connection), and checks what a retry of the key gets.
func runPanicPoints(t *testing.T, newStore func(t *testing.T) idemserver.Store) {
	for _, pp := range panicPoints {
		t.Run(pp.name, func(t *testing.T) {
			var runs atomic.Int64
			h := (&idemserver.Middleware{Store: newStore(t), SingleTenant: true, Logger: slog.New(slog.DiscardHandler)}).Wrap(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						pp.at(w)
						panic("after " + pp.name)
					}
					w.WriteHeader(http.StatusCreated)
				}))
			srv := httptest.NewUnstartedServer(h)
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
			srv.Start()
			defer srv.Close()
			send := func() (int, error) {
				req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "k-"+strings.ReplaceAll(pp.name, " ", "-"))
				resp, err := srv.Client().Do(req)
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				_, err = io.ReadAll(resp.Body)
				return resp.StatusCode, err
			}
			_, _ = send() // the panicking run: the connection is aborted, or hijacked
			// A hijacking handler closed the connection before it panicked:
			// the retry can arrive while the middleware still finishes the
			// key, and get 409 in progress, as a client would retry.
			got, err := send()
			for deadline := time.Now().Add(5 * time.Second); err == nil && got == http.StatusConflict && time.Now().Before(deadline); {
				<-time.After(10 * time.Millisecond)
				got, err = send()
			}
			require.NoError(t, err)
			assert.Equal(t, pp.want, got)
			assert.Equal(t, pp.wantRn, runs.Load(), "the handler's runs")
		})
	}
}

// TestLegacyRecoveryPointResumesAnotherRequest: a recovery point the
// previous release (2d053bb) saved under the key alone is found by any
// request with that key: after X's run saved "paid x" and rolled back
// before the upgrade (releasing its key), a request Y with the same key
// and another body resumes from X's point after the upgrade, skips its
// own payment and is answered with X's: the bug
// TestRecoveryPointOutlivesItsRequest fixed for new points, alive for
// old ones until they are pruned.
//
// Kept, as an accepted limit (RELEASING.md's table of formats, recovery
// points): the old point holds no fingerprint, so the new code cannot
// tell X's retry from Y. Ignoring legacy points instead would make X's
// retry start over and make its calls to other services again, replayed
// only where a service honours the TxKey.DeriveKey key and run twice
// elsewhere; Y reuses a key with
// another body, a client's error. Failing closed means keeping the
// previous release's reading for its own points until they are pruned
// with their keys. Without the skip it fails: Y is answered "x".
func TestLegacyRecoveryPointResumesAnotherRequest(t *testing.T) {
	t.Skip("accepted limit (RELEASING.md): a recovery point of 2d053bb (key alone) is resumed by any request with its key")
	ctx := context.Background()
	s := newTxSchema(t)
	pool := s.pool(t, 4)
	m := newTx(t, s, 4, &postgres.TxOptions{Logger: discardLogger()})
	// As 2d053bb's SaveRecoveryPoint wrote X's point: the single-tenant
	// scoped key ("0::" and the key) as the row's key.
	_, err := pool.Exec(ctx, `INSERT INTO idemhttp_recovery (key, step, data) VALUES ($1, 'paid', 'x')`, []byte("0::k"))
	require.NoError(t, err)
	var payments []string
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
			payments = append(payments, string(body))
			paid = body
		}
		if err := postgres.ClearRecoveryPoints(r.Context(), tx, k); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		_, err = w.Write(paid)
		return err
	})
	got := post(t, h, "k", "y")
	require.Equal(t, http.StatusCreated, got.Status)
	assert.Equal(t, "y", got.Body, "the request for y was answered with x's payment")
	assert.Equal(t, []string{"y"}, payments, "y was never paid")
}
