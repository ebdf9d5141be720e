package postgres_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/internal/servercore"
	"github.com/idemkit/idemhttp/internal/servertest"
)

// The tests of TxMiddleware's own statements on a pool's connection (the
// wire, txwire.go): what the connection is left in, and prepared
// statements the server no longer holds as the wire took them.

// wireTx returns a TxMiddleware on a pool of one connection, so that
// every request meets what the one before left on it, and the pool.
func wireTx(t *testing.T, s *testSchema) (*postgres.TxMiddleware, *pgxpool.Pool) {
	t.Helper()
	pool := s.pool(t, 1)
	m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
	require.NoError(t, err)
	return m, pool
}

// requireClean checks that the pool's connection is outside any
// transaction, holds no lock and answers in step: a connection given back
// mid-transaction or mid-flight would fail one of them.
func requireClean(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus(), "the connection came back in a transaction")
	var locks int
	var marker string
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'), 'in step'`).Scan(&locks, &marker))
	assert.Zero(t, locks, "advisory locks held")
	assert.Equal(t, "in step", marker)
	var status string
	require.NoError(t, conn.QueryRow(ctx, `SELECT state FROM pg_stat_activity WHERE pid = pg_backend_pid()`).Scan(&status))
	assert.Equal(t, "active", status)
}

// TestTxWireLeavesTheConnectionClean: whatever the handler did (failed,
// panicked, committed itself, committed and began again, left the
// transaction aborted, saw its client leave), the pool's one connection
// is given back outside any transaction and in step (or replaced), and
// the next request is served on it. Checked to fail with the wire's run
// keeping the connection after a failed exchange (w.close() dropped):
// the client that left mid-claim handed the next request a connection
// whose answers were the claim's; and with the wire's watch of the
// client's context dropped (no context.AfterFunc in run): the claim
// waited out the minute of DBTimeout.
func TestTxWireLeavesTheConnectionClean(t *testing.T) {
	s := newTxSchema(t)
	m, pool := wireTx(t, s)
	tests := []struct {
		name string
		give func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
	}{
		{"error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(w, r, tx)
			return errors.New("declined")
		}},
		{"panic", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(w, r, tx)
			panic("handler bug")
		}},
		{"commit", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(w, r, tx)
			_, err := tx.Exec(r.Context(), "COMMIT")
			return err
		}},
		{"commit-begin", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(w, r, tx)
			_, _ = tx.Exec(r.Context(), "COMMIT")
			_, err := tx.Exec(r.Context(), "BEGIN")
			return err
		}},
		{"aborted", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			_, _ = tx.Exec(r.Context(), "SELECT 1/0")
			w.WriteHeader(http.StatusCreated)
			return nil
		}},
		{"cancelled", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_ = chargeTx(httptest.NewRecorder(), r, tx)
			cancel := r.Context().Value(cancelKey{}).(context.CancelFunc)
			cancel()
			_, err := tx.Exec(r.Context(), "SELECT pg_sleep(0.01)")
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := m.WrapFunc(tt.give)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("x")).
				WithContext(context.WithValue(ctx, cancelKey{}, cancel))
			req.Header.Set("Idempotency-Key", "clean-"+tt.name)
			func() {
				defer func() { _ = recover() }()
				h.ServeHTTP(httptest.NewRecorder(), req)
			}()
			requireClean(t, pool)
			assert.Equal(t, http.StatusCreated, post(t, m.WrapFunc(chargeTx), "clean-next-"+tt.name, "x").Status)
			requireClean(t, pool)
		})
	}

	t.Run("client-left-mid-claim", func(t *testing.T) {
		// The claim's insert waits for the key's row, locked by another
		// transaction, until the client leaves.
		admin := s.admin(t)
		ctx := context.Background()
		_, err := admin.Exec(ctx, `INSERT INTO `+s.name+`.idemhttp_keys (key, token, fingerprint, expires_at) VALUES ($1, 'x', 'x', now() - interval '1 hour')`, postgres.ScopedRowKey("", "clean-waits"))
		require.NoError(t, err)
		lock, err := admin.Begin(ctx)
		require.NoError(t, err)
		_, err = lock.Exec(ctx, `SELECT 1 FROM `+s.name+`.idemhttp_keys WHERE key = $1 FOR UPDATE`, postgres.ScopedRowKey("", "clean-waits"))
		require.NoError(t, err)
		code, took := postWithin(m.WrapFunc(chargeTx), "clean-waits", 300*time.Millisecond)
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Less(t, took, 300*time.Millisecond+3*time.Second, "the claim outlived its client") // the slack: a busy machine's scheduling
		require.NoError(t, lock.Rollback(ctx))
		requireClean(t, pool)
		assert.Equal(t, http.StatusCreated, post(t, m.WrapFunc(chargeTx), "clean-after-wait", "x").Status)
		requireClean(t, pool)
	})
}

type cancelKey struct{}

// TestTxWireStatementsDeallocated: the wire's prepared statements gone
// from the server session (DISCARD ALL, as a pooler resets a session;
// DEALLOCATE ALL through the handler's connection) or answering a result
// type a schema change moved: the request in the way fails closed (no
// effect committed) or, for a claim, is served on a fresh connection, and
// the requests after it are served. Checked to fail with staleStatement
// answering false: the connection kept failing every claim with
// "prepared statement does not exist" (26000), and the replay after the
// schema change with "cached plan must not change result type" (0A000).
func TestTxWireStatementsDeallocated(t *testing.T) {
	s := newTxSchema(t)
	m, pool := wireTx(t, s)
	h := m.WrapFunc(chargeTx)
	ctx := context.Background()
	require.Equal(t, http.StatusCreated, post(t, h, "prep-1", "x").Status)
	require.True(t, post(t, h, "prep-1", "x").Replayed) // the lookup prepared too

	t.Run("discard-all", func(t *testing.T) {
		_, err := pool.Exec(ctx, "DISCARD ALL")
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, post(t, h, "prep-2", "x").Status)
		assert.Len(t, charges(t, s, "prep-2"), 1)
		assert.True(t, post(t, h, "prep-1", "x").Replayed)
		requireClean(t, pool)
	})

	t.Run("deallocate-in-handler", func(t *testing.T) {
		dealloc := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			if err := chargeTx(w, r, tx); err != nil {
				return err
			}
			_, err := tx.Exec(r.Context(), "DEALLOCATE ALL")
			return err
		})
		got := post(t, dealloc, "prep-3", "x")
		assert.GreaterOrEqual(t, got.Status, 500, "the store could not be written: nothing committed")
		assert.Empty(t, charges(t, s, "prep-3"))
		requireClean(t, pool)
		assert.Equal(t, http.StatusCreated, post(t, h, "prep-3", "x").Status)
		assert.Len(t, charges(t, s, "prep-3"), 1)
	})

	t.Run("result-type-changed", func(t *testing.T) {
		require.Equal(t, http.StatusCreated, post(t, h, "prep-4", "x").Status)
		require.True(t, post(t, h, "prep-4", "x").Replayed)
		admin := s.admin(t)
		_, err := admin.Exec(ctx, `CREATE DOMAIN `+s.name+`.token_d AS bytea`)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `ALTER TABLE `+s.name+`.idemhttp_keys ALTER COLUMN token TYPE `+s.name+`.token_d`)
		require.NoError(t, err)
		assert.True(t, post(t, h, "prep-4", "x").Replayed)
		assert.Equal(t, http.StatusCreated, post(t, h, "prep-5", "x").Status)
		requireClean(t, pool)
	})
}

// tracedPool is s.pool with a tracer: TxMiddleware's statements then go
// through pgx.Batch (the wire would hide them from the tracer).
func tracedPool(t *testing.T, s *testSchema, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return configuredPool(t, s, maxConns, func(cfg *pgx.ConnConfig) { cfg.Tracer = nopTracer{} })
}

// unnamedPool is s.pool whose statements are not kept prepared
// (pgx.QueryExecModeExec, as for a pooler that does not keep them): the
// wire parses its statements unnamed in every flight.
func unnamedPool(t *testing.T, s *testSchema, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return configuredPool(t, s, maxConns, func(cfg *pgx.ConnConfig) { cfg.DefaultQueryExecMode = pgx.QueryExecModeExec })
}

func configuredPool(t *testing.T, s *testSchema, maxConns int32, configure func(*pgx.ConnConfig)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	configure(cfg.ConnConfig)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

type nopTracer struct{}

func (nopTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (nopTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestTxLargeObjectsEndWithTheRequest: the handler's large objects work in
// the request's transaction (committed with it, on the wire and on the
// pgx path), and fail with pgx.ErrTxClosed once the handler has returned,
// so that a goroutine it left cannot write through a connection back in
// the pool. Checked to fail with release not calling endLargeObjects: the
// object made after the request was made, on both paths.
func TestTxLargeObjectsEndWithTheRequest(t *testing.T) {
	s := newTxSchema(t)
	for name, pool := range map[string]*pgxpool.Pool{"wire": s.pool(t, 1), "pgx": tracedPool(t, s, 1)} {
		t.Run(name, func(t *testing.T) {
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
			require.NoError(t, err)
			var (
				kept pgx.LargeObjects
				oid  uint32
			)
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				kept = tx.LargeObjects()
				var err error
				if oid, err = kept.Create(r.Context(), 0); err != nil {
					return err
				}
				w.WriteHeader(http.StatusCreated)
				return nil
			})
			require.Equal(t, http.StatusCreated, post(t, h, "lo-"+name, "x").Status)
			ctx := context.Background()
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata WHERE oid = $1`, oid).Scan(&n))
			assert.Equal(t, 1, n, "the large object committed with the request")
			_, err = kept.Create(ctx, 0)
			assert.ErrorIs(t, err, pgx.ErrTxClosed)
			requireClean(t, pool)
		})
	}
}

// TestTxConformanceOtherPools: TxMiddleware answers the shell suite's
// scenarios as the modelled transactional shell does, as it does on the
// wire with prepared statements (TestTxConformance), on a pool whose
// statements go through pgx.Batch (a tracer, here; the simple protocol
// likewise) and on one that keeps no statement prepared (the wire parses
// them in each flight). Checked to fail with the wire naming its
// statements on a pool that keeps none (the second flight on a connection
// met "prepared statement already exists").
func TestTxConformanceOtherPools(t *testing.T) {
	serverURL(t)
	for name, pool := range map[string]func(*testing.T, *testSchema, int32) *pgxpool.Pool{"pgx": tracedPool, "unnamed": unnamedPool} {
		t.Run(name, func(t *testing.T) {
			servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
				s := newTxSchema(t)
				m, err := postgres.NewTxMiddleware(context.Background(), pool(t, s, 20),
					&postgres.TxOptions{SingleTenant: true, MaxStoredBody: app.MaxStoredBody, Logger: discardLogger()})
				require.NoError(t, err)
				return &servertest.Target{
					Mode:           servercore.Transactional,
					Handler:        m.WrapFunc(txApp(app)),
					Effects:        func(key string) int { return len(charges(t, s, key)) },
					RefuseComplete: refusingStores(t, s),
				}
			})
		})
	}
}

// TestTxWireQuotedTableName: a key table in a schema whose name needs
// quoting, and reads as SQL if it is not, serves keys on the wire (a
// claim, then a replay) and runs nothing of its name. Checked to fail
// with findTable's quote_ident dropped: the claim's statement did not
// parse, and the request got 503.
func TestTxWireQuotedTableName(t *testing.T) {
	base := newTxSchema(t) // for the URL, and a table the name would drop
	name := base.name + `"; DROP TABLE ` + base.name + `.a1_charges; --`
	quoted := pgx.Identifier{name}.Sanitize()
	ctx := context.Background()
	admin := base.admin(t)
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+quoted)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = base.admin(t).Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE") })
	_, err = admin.Exec(ctx, "CREATE TABLE "+quoted+`.a1_charges (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount integer NOT NULL)`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(base.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = quoted
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, postgres.Migrate(ctx, pool))
	m, err := postgres.NewTxMiddleware(ctx, pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
	require.NoError(t, err)
	h := m.WrapFunc(chargeTx)
	first := post(t, h, "quoted", "x")
	require.Equal(t, http.StatusCreated, first.Status, first.Body)
	assert.Equal(t, reply{Status: http.StatusCreated, Replayed: true, Body: first.Body}, post(t, h, "quoted", "x"))
	var n int
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+quoted+".idemhttp_keys").Scan(&n))
	assert.Equal(t, 1, n)
	require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+base.name+".a1_charges").Scan(&n), "the other schema's table is there")
}

// TestTxKeylessAbortedIsNotCommitted: a request without a key whose
// handler swallowed a failed statement (the transaction aborted) and
// answered 201 gets an error instead, on the wire and on the pgx path:
// PostgreSQL answers that COMMIT with ROLLBACK, not an error, and its
// charge is not there. Checked to fail with commitWire's check of the
// COMMIT's tag dropped: the client got 201 for a rolled-back charge.
func TestTxKeylessAbortedIsNotCommitted(t *testing.T) {
	s := newTxSchema(t)
	for name, pool := range map[string]*pgxpool.Pool{"wire": s.pool(t, 1), "pgx": tracedPool(t, s, 1)} {
		t.Run(name, func(t *testing.T) {
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
			require.NoError(t, err)
			key := "keyless-" + name
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, 1)`, key); err != nil {
					return err
				}
				_, _ = tx.Exec(r.Context(), "SELECT 1/0") // swallowed
				w.WriteHeader(http.StatusCreated)
				return nil
			})
			got := post(t, h, "", "x")
			assert.GreaterOrEqual(t, got.Status, 500, got.Body)
			assert.Empty(t, charges(t, s, key))
			requireClean(t, pool)
		})
	}
}
