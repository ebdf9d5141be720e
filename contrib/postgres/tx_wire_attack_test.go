package postgres_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
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
	"github.com/idemkit/idemhttp/idemserver"
)

// Attacks on TxMiddleware's own statements on the wire (txwire.go), each
// named after the bug it pins.

// unclosedPool is s.pool for a test that may leave a connection
// acquired: its cleanup does not wait for the pool to close (pgxpool's
// Close waits for every acquired connection, for ever).
func unclosedPool(t *testing.T, s *testSchema, maxConns int32, configure func(*pgxpool.Config)) (pool *pgxpool.Pool, closeWithin func(time.Duration) bool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	cfg.MaxConns = maxConns
	if configure != nil {
		configure(cfg)
	}
	pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	return pool, func(d time.Duration) bool {
		closed := make(chan struct{})
		go func() { pool.Close(); close(closed) }()
		select {
		case <-closed:
			return true
		case <-time.After(d):
			return false
		}
	}
}

// postSafely is post that turns a panic of the handler chain into a
// failed reply (status 0, the panic in Body), as net/http would drop the
// connection.
func postSafely(t *testing.T, h http.Handler, key, body string) (got reply) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			got = reply{Body: fmt.Sprint("panic: ", p)}
		}
	}()
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return reply{Status: rec.Code, Replayed: rec.Header().Get(idemserver.ReplayedHeader) == "true", Body: rec.Body.String()}
}

// TestTxWireReplaysLargeResponse: a stored response larger than the
// buffer a connection keeps between flights (64 KiB) replays, on the wire
// as through pgx, and the connection goes back to the pool. On main the
// wire's run trimmed its buffer of the flight's values before the lookup
// decoded them: every replay of such a response panicked (index out of
// range), and the connection it held was never given back, so that a pool
// of one answered every later request 503 and pgxpool's Close hung.
// Checked to fail with run's deferred trim of the values restored.
func TestTxWireReplaysLargeResponse(t *testing.T) {
	s := newTxSchema(t)
	for _, traced := range []bool{false, true} {
		name := map[bool]string{false: "wire", true: "pgx"}[traced]
		t.Run(name, func(t *testing.T) {
			pool, closeWithin := unclosedPool(t, s, 1, func(cfg *pgxpool.Config) {
				if traced {
					cfg.ConnConfig.Tracer = nopTracer{}
				}
			})
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{
				SingleTenant: true, DBTimeout: 3 * time.Second, Logger: discardLogger()})
			require.NoError(t, err)
			big := strings.Repeat("b", 100<<10) // over the 64 KiB a connection keeps, under MaxStoredBody
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if err := chargeTx(httptest.NewRecorder(), r, tx); err != nil {
					return err
				}
				w.WriteHeader(http.StatusCreated)
				_, err := w.Write([]byte(big))
				return err
			})
			key := "large-" + name
			first := postSafely(t, h, key, "x")
			require.Equal(t, http.StatusCreated, first.Status, first.Body)
			for range 2 {
				got := postSafely(t, h, key, "x")
				assert.Equal(t, http.StatusCreated, got.Status, "%.200s", got.Body)
				assert.True(t, got.Replayed)
				assert.Equal(t, len(big), len(got.Body))
			}
			assert.Len(t, charges(t, s, key), 1)
			next := postSafely(t, m.WrapFunc(chargeTx), "large-next-"+name, "x")
			assert.Equal(t, http.StatusCreated, next.Status, "%.200s", next.Body)
			assert.True(t, closeWithin(10*time.Second), "a connection was never given back to the pool")
		})
	}
}

// gatedValue is a statement argument whose encoding waits for its gate:
// it holds a statement between handlerTx's check that the transaction is
// open and the statement's send, as a busy machine may.
type gatedValue struct {
	value   string
	entered chan struct{}
	gate    chan struct{}
}

func (v gatedValue) Value() (driver.Value, error) {
	close(v.entered)
	<-v.gate
	return v.value, nil
}

// TestTxLeftGoroutineWritesAfterTheEnd: a statement a goroutine the
// handler left began through the request's tx just before the handler
// returned (it passed handlerTx's closed check; its arguments were still
// being encoded) must not run once the request has ended: not in
// autocommit on the connection back in the pool, committed though the
// request rolled back and its client got 500 "nothing was committed",
// nor inside the next request's transaction on that connection. On both
// paths it runs, and commits: handlerTx.close does not wait for, or
// detect, a statement already past its check, and the connection goes
// back to the pool meanwhile. (Large objects the handler kept have the
// same window, wider: they work through a pgx transaction closed only as
// the connection is released, after the commit.)
func TestTxLeftGoroutineWritesAfterTheEnd(t *testing.T) {
	t.Skip("bug: handlerTx.close does not stop a statement already past its closed check; it runs after the request ends, in autocommit or in the next request's transaction")
	s := newTxSchema(t)
	for _, traced := range []bool{false, true} {
		name := map[bool]string{false: "wire", true: "pgx"}[traced]
		t.Run(name, func(t *testing.T) {
			pool := s.pool(t, 1)
			if traced {
				pool = tracedPool(t, s, 1)
			}
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
			require.NoError(t, err)
			v := gatedValue{value: "left-" + name, entered: make(chan struct{}), gate: make(chan struct{})}
			left := make(chan error, 1)
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				go func() {
					_, err := tx.Exec(context.Background(), `INSERT INTO a1_charges (idem_key, amount) VALUES ($1, 1)`, v)
					left <- err
				}()
				<-v.entered
				return errors.New("declined") // rolled back: nothing of the request commits
			})
			got := post(t, h, "left-"+name, "x")
			require.Equal(t, http.StatusInternalServerError, got.Status, got.Body)
			close(v.gate)
			err = <-left
			assert.Error(t, err, "the statement ran after the request ended")
			assert.Empty(t, charges(t, s, v.value), "a write of the rolled-back request committed")
		})
	}
}

// TestTxWireDeallocateAllHookKeepsTheConnection: a pool whose
// AfterRelease resets the session's prepared statements with pgx's own
// Conn.DeallocateAll (which pgx's statement cache follows) serves every
// request on its one connection, as the pgx.Batch path does. The wire
// does not see pgx's reset (pgx v5.13 exposes no statement cache to
// compare), so every next claim on the connection finds its statements
// gone (26000), closes the connection and claims again on a new one: a
// reconnect per request (6 backends for 6 requests here, 1 through
// pgx), every request's claim failing once. The fix is not local: the
// wire would have to re-learn, on the connection, which of its
// statements the server still holds (pg_prepared_statements) instead of
// closing it.
func TestTxWireDeallocateAllHookKeepsTheConnection(t *testing.T) {
	t.Skip("bug: the wire closes and replaces a connection whose prepared statements pgx's DeallocateAll reset: a reconnect per request")
	s := newTxSchema(t)
	for _, traced := range []bool{false, true} {
		name := map[bool]string{false: "wire", true: "pgx"}[traced]
		t.Run(name, func(t *testing.T) {
			pool := configuredPoolWith(t, s, 1, func(cfg *pgxpool.Config) {
				if traced {
					cfg.ConnConfig.Tracer = nopTracer{}
				}
				cfg.AfterRelease = func(c *pgx.Conn) bool {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					return c.DeallocateAll(ctx) == nil
				}
			})
			m, err := postgres.NewTxMiddleware(context.Background(), pool, &postgres.TxOptions{SingleTenant: true, Logger: discardLogger()})
			require.NoError(t, err)
			pids := make(chan uint32, 6)
			h := m.WrapFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				pids <- tx.Conn().PgConn().PID()
				return chargeTx(w, r, tx)
			})
			for i := range cap(pids) {
				assert.Equal(t, http.StatusCreated, post(t, h, fmt.Sprintf("dealloc-%s-%d", name, i), "x").Status)
			}
			close(pids)
			seen := map[uint32]bool{}
			for pid := range pids {
				seen[pid] = true
			}
			assert.Len(t, seen, 1, "the pool's one connection was replaced")
		})
	}
}

// configuredPoolWith is s.pool with configure applied to the pool's
// configuration.
func configuredPoolWith(t *testing.T, s *testSchema, maxConns int32, configure func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pool, _ := unclosedPool(t, s, maxConns, configure)
	t.Cleanup(pool.Close)
	return pool
}
