package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// TestInboxSQLConformance runs the database/sql inbox's suite on
// PostgreSQL through pgx's database/sql driver, each subtest in its own
// schema.
func TestInboxSQLConformance(t *testing.T) {
	serverURL(t)
	inboxtest.Run(t, func(t *testing.T) *sql.DB {
		s := newSchema(t)
		db := stdlib.OpenDBFromPool(s.pool(t, 16))
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}

// TestInboxSQLUpgrade runs the database/sql inbox's upgrade suite on
// PostgreSQL: the previous release's table and ids, each subtest in its
// own schema.
func TestInboxSQLUpgrade(t *testing.T) {
	serverURL(t)
	inboxtest.RunUpgrade(t, "postgres", func(t *testing.T) *sql.DB {
		s := newEmptySchema(t)
		db := stdlib.OpenDBFromPool(s.pool(t, 8))
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}

// TestInboxLedgerConformance runs the ledger suite on both PostgreSQL
// ledgers, inbox.SQL's through database/sql and the Inbox's through pgx,
// each in its own schema, whose processed messages are those their
// Handle recorded.
func TestInboxLedgerConformance(t *testing.T) {
	serverURL(t)
	t.Run("sql", func(t *testing.T) {
		inboxtest.RunLedger(t, func(t *testing.T) inboxtest.LedgerFixture {
			db := stdlib.OpenDBFromPool(newSchema(t).pool(t, 20))
			t.Cleanup(func() { _ = db.Close() })
			in := &inbox.SQL{DB: db}
			h := in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
			return inboxtest.LedgerFixture{Ledger: in.Ledger("billing"), Process: func(ctx context.Context, k inbox.Key) error {
				return h(ctx, &inbox.Message{ID: k.ID, IDSpace: k.IDSpace})
			}, Redrive: in.Ledger("billing").Redrive}
		})
	})
	t.Run("pgx", func(t *testing.T) {
		inboxtest.RunLedger(t, func(t *testing.T) inboxtest.LedgerFixture {
			in := postgres.NewInbox(newSchema(t).pool(t, 20))
			h := in.Handle("billing", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
			return inboxtest.LedgerFixture{Ledger: in.Ledger("billing"), Process: func(ctx context.Context, k inbox.Key) error {
				return h(ctx, &inbox.Message{ID: k.ID, IDSpace: k.IDSpace})
			}, Redrive: in.Ledger("billing").Redrive}
		})
	})
}

// newEmptySchema is newSchema without Migrate: a schema for the previous
// release's tables.
func newEmptySchema(t testing.TB) *testSchema {
	t.Helper()
	s := &testSchema{url: serverURL(t), name: "idemtest_" + randomHex(6)}
	_, err := s.admin(t).Exec(context.Background(), "CREATE SCHEMA "+s.name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := s.admin(t).Exec(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
		require.NoError(t, err)
	})
	return s
}

// inboxFixture is a schema with the inbox table and a business table,
// d1_effects, with one row per execution of an effect.
type inboxFixture struct {
	pool *pgxpool.Pool
	in   *postgres.Inbox
}

func newInboxFixture(t *testing.T) *inboxFixture {
	t.Helper()
	s := newSchema(t)
	pool := s.pool(t, 110)
	_, err := pool.Exec(context.Background(), "CREATE TABLE d1_effects (consumer text NOT NULL, id text NOT NULL)")
	require.NoError(t, err)
	return &inboxFixture{pool: pool, in: postgres.NewInbox(pool)}
}

func effectTx(consumer, id string) func(ctx context.Context, tx pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", consumer, id)
		return err
	}
}

func (f *inboxFixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.pool.QueryRow(context.Background(), q, args...).Scan(&n))
	return n
}

func (f *inboxFixture) effects(t *testing.T, consumer, id string) int {
	t.Helper()
	return f.count(t, "SELECT count(*) FROM d1_effects WHERE consumer = $1 AND id = $2", consumer, id)
}

func TestInboxNewThenDuplicate(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	res, err := f.in.Process(ctx, "billing", "m-1", effectTx("billing", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	res, err = f.in.Process(ctx, "billing", "m-1", func(context.Context, pgx.Tx) error {
		t.Error("a duplicate runs nothing")
		return nil
	})
	require.NoError(t, err)
	assert.True(t, res.Duplicate)
	res, err = f.in.Process(ctx, "mailer", "m-1", effectTx("mailer", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate, "another consumer's inbox")
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"))
	assert.Equal(t, 1, f.effects(t, "mailer", "m-1"))
}

// TestInboxConcurrentRedeliveries delivers one message 50 times at once:
// one effect. Beside it, the check-then-write consumer (SELECT the id, then
// write) gets the same 50 deliveries and makes duplicates. Replacing
// Process's insert with that check made this test fail (44 effects).
func TestInboxConcurrentRedeliveries(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	const deliveries = 50
	warm(t, f.pool, 2*deliveries)
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	dups := 0
	for range deliveries {
		wg.Go(func() {
			<-start
			res, err := f.in.Process(ctx, "billing", "m-1", effectTx("billing", "m-1"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if res.Duplicate {
				dups++
			}
		})
	}
	for range deliveries {
		wg.Go(func() {
			<-start
			_ = checkThenWrite(ctx, f.pool, "naive", "m-1")
		})
	}
	close(start)
	wg.Wait()
	require.Empty(t, errs)
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"), "one effect for 50 concurrent deliveries")
	assert.Equal(t, deliveries-1, dups)
	t.Logf("check-then-write: %d effects for %d concurrent deliveries; the inbox: %d",
		f.effects(t, "naive", "m-1"), deliveries, f.effects(t, "billing", "m-1"))
}

// warm opens n connections in pool, so that concurrent deliveries overlap
// instead of queueing behind connection set-up.
func warm(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// checkThenWrite is the tempting wrong design the inbox replaces.
func checkThenWrite(ctx context.Context, pool *pgxpool.Pool, consumer, id string) error {
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM d1_effects WHERE consumer = $1 AND id = $2", consumer, id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := pool.Exec(ctx, "INSERT INTO d1_effects (consumer, id) VALUES ($1, $2)", consumer, id)
	return err
}

// TestInboxHandlerErrorRollsBack checks that a failed handler takes its id
// with it, so that the redelivery runs. (Committing the id on its own
// before the handler makes the redelivery a duplicate: this test fails.)
func TestInboxHandlerErrorRollsBack(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	boom := errors.New("boom")
	_, err := f.in.Process(ctx, "billing", "m-1", func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, effectTx("billing", "m-1")(ctx, tx))
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox"))
	assert.Zero(t, f.effects(t, "billing", "m-1"))

	assert.Panics(t, func() {
		_, _ = f.in.Process(ctx, "billing", "m-1", func(ctx context.Context, tx pgx.Tx) error {
			require.NoError(t, effectTx("billing", "m-1")(ctx, tx))
			panic("boom")
		})
	})
	assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox"))

	res, err := f.in.Process(ctx, "billing", "m-1", effectTx("billing", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"))
}

func TestInboxBatch(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	_, err := f.in.Process(ctx, "billing", "m-2", effectTx("billing", "m-2"))
	require.NoError(t, err)
	ids := []string{"m-1", "m-2", "m-3", "m-1", strings.Repeat("long", 100)}
	var ran []int
	res, err := f.in.ProcessBatch(ctx, "billing", ids, func(ctx context.Context, tx pgx.Tx, i int) error {
		ran = append(ran, i)
		return effectTx("billing", inbox.StoredID(ids[i]))(ctx, tx)
	})
	require.NoError(t, err)
	assert.Equal(t, []inbox.Result{{}, {Duplicate: true}, {}, {Duplicate: true}, {}}, res)
	assert.Equal(t, []int{0, 2, 4}, ran)
	assert.Equal(t, 4, f.count(t, "SELECT count(*) FROM d1_effects"))
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE id LIKE 'sha256:%'"), "the long id is hashed")

	boom := errors.New("boom")
	_, err = f.in.ProcessBatch(ctx, "billing", []string{"m-4", "m-5"}, func(ctx context.Context, tx pgx.Tx, i int) error {
		if i == 1 {
			return boom
		}
		return effectTx("billing", "m-4")(ctx, tx)
	})
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, f.effects(t, "billing", "m-4"), "the batch rolled back as a whole")
	assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE id IN ('m-4', 'm-5')"))
}

func TestInboxBadInput(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	never := func(context.Context, pgx.Tx) error {
		t.Error("nothing may run")
		return nil
	}
	_, err := f.in.Process(ctx, "billing", "", never)
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
	_, err = f.in.Process(ctx, "", "m-1", never)
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
	_, err = f.in.Process(ctx, "bad\xff", "m-1", never)
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
	assert.ErrorIs(t, f.in.Handle("billing", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })(ctx, &inbox.Message{}), inbox.ErrNoMessageID)

	f.pool.Close()
	res, err := f.in.Process(ctx, "billing", "m-1", never)
	assert.Error(t, err, "a closed pool is an error, not a duplicate")
	assert.False(t, res.Duplicate)
}

func TestInboxPrune(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	f.in.MinRetention = time.Hour
	// Two hours old by the database's clock.
	_, err := f.pool.Exec(ctx, `INSERT INTO idemhttp_inbox (consumer, id, processed_at)
SELECT 'billing', 'old-' || i, (extract(epoch from now() - interval '2 hours') * 1000000)::bigint FROM generate_series(1, 2500) AS i`)
	require.NoError(t, err)
	_, err = f.in.Process(ctx, "billing", "new", effectTx("billing", "new"))
	require.NoError(t, err)
	n, err := f.in.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, int64(2500), n)
	res, err := f.in.Process(ctx, "billing", "new", effectTx("billing", "new"))
	require.NoError(t, err)
	assert.True(t, res.Duplicate)

	// Under the minimum: refused, nothing deleted. (Without the check,
	// Prune(ctx, time.Second) deleted "new": this failed.)
	for _, give := range []time.Duration{0, time.Second, 59 * time.Minute} {
		n, err := f.in.Prune(ctx, give)
		assert.ErrorIs(t, err, inbox.ErrRetention, give)
		assert.Zero(t, n)
	}
	f.in.MinRetention = 0
	_, err = f.in.Prune(ctx, inbox.DefaultMinRetention-time.Second)
	assert.ErrorIs(t, err, inbox.ErrRetention)
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM idemhttp_inbox"))
}

// TestInboxDatabaseClock checks that processed_at is the database's clock
// (the transaction's now()), for pgx's Inbox and inbox.SQL alike, so that
// Prune, which cuts by the same clock, cannot delete an id early because a
// consumer's clock runs ahead. (With processed_at from time.Now() in the
// consumer, the values differed: this test failed.)
func TestInboxDatabaseClock(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	db := stdlib.OpenDBFromPool(f.pool)
	t.Cleanup(func() { _ = db.Close() })
	sqlIn := &inbox.SQL{DB: db}
	const now = "SELECT (extract(epoch from now()) * 1000000)::bigint"
	var want [4]int64
	_, err := f.in.Process(ctx, "pgx", "m-1", func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, now).Scan(&want[0])
	})
	require.NoError(t, err)
	_, err = f.in.ProcessBatch(ctx, "pgx", []string{"m-2", "m-3"}, func(ctx context.Context, tx pgx.Tx, _ int) error {
		return tx.QueryRow(ctx, now).Scan(&want[1])
	})
	require.NoError(t, err)
	_, err = sqlIn.Process(ctx, "sql", "m-1", func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, now).Scan(&want[2])
	})
	require.NoError(t, err)
	_, err = sqlIn.ProcessBatch(ctx, "sql", []string{"m-2", "m-3"}, func(ctx context.Context, tx *sql.Tx, _ int) error {
		return tx.QueryRowContext(ctx, now).Scan(&want[3])
	})
	require.NoError(t, err)
	for i, k := range [][2]string{{"pgx", "m-1"}, {"pgx", "m-3"}, {"sql", "m-1"}, {"sql", "m-3"}} {
		assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE consumer = $1 AND id = $2 AND processed_at = $3", k[0], k[1], want[i]), k)
	}
}

// TestInboxDeadlineEndsTransaction runs a handler that ignores its
// context (a statement under context.WithoutCancel that would sleep for
// 10 s) under a 300 ms deadline, with pgx's Inbox and inbox.SQL: the
// server cancels the statement (statement_timeout from the deadline),
// nothing commits, and the id stays free for a redelivery. (Without the
// timeouts the sleep ran its 10 s and the handler's statement succeeded:
// this test failed.)
func TestInboxDeadlineEndsTransaction(t *testing.T) {
	f := newInboxFixture(t)
	db := stdlib.OpenDBFromPool(f.pool)
	t.Cleanup(func() { _ = db.Close() })
	sqlIn := &inbox.SQL{DB: db}
	tests := []struct {
		give string
		run  func(ctx context.Context) (stmtErr error, err error)
	}{
		{give: "pgx", run: func(ctx context.Context) (stmtErr, err error) {
			_, err = f.in.Process(ctx, "pgx", "m-1", func(ctx context.Context, tx pgx.Tx) error {
				_, stmtErr = tx.Exec(context.WithoutCancel(ctx), "SELECT pg_sleep(10)")
				return stmtErr
			})
			return stmtErr, err
		}},
		{give: "sql", run: func(ctx context.Context) (stmtErr, err error) {
			_, err = sqlIn.Process(ctx, "sql", "m-1", func(ctx context.Context, tx *sql.Tx) error {
				_, stmtErr = tx.ExecContext(context.WithoutCancel(ctx), "SELECT pg_sleep(10)")
				return stmtErr
			})
			return stmtErr, err
		}},
	}
	for _, tt := range tests {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		stmtErr, err := tt.run(ctx)
		cancel()
		require.Error(t, err, tt.give)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, stmtErr, &pgErr, tt.give)
		assert.Equal(t, "57014", pgErr.Code, "%s: query_canceled by statement_timeout: %v", tt.give, pgErr)
		assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE consumer = $1", tt.give), tt.give)
	}
	// No deadline, no timeouts: the transaction's settings are the
	// server's.
	_, err := f.in.Process(context.Background(), "pgx", "m-2", func(ctx context.Context, tx pgx.Tx) error {
		var v string
		if err := tx.QueryRow(ctx, "SELECT current_setting('statement_timeout')").Scan(&v); err != nil {
			return err
		}
		assert.Equal(t, "0", v)
		return nil
	})
	require.NoError(t, err)
}

// TestInboxIDSpaces checks that pgx's Handle records ids per id space, as
// inbox.SQL's does: the same id from two queues runs twice. (With Handle
// ignoring m.IDSpace, the refunds queue's m-1 was a duplicate: this test
// failed.)
func TestInboxIDSpaces(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	var ran []string
	h := f.in.Handle("billing", func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		ran = append(ran, m.IDSpace)
		return effectTx("billing", m.IDSpace+"/"+m.ID)(ctx, tx)
	})
	for _, space := range []string{"orders", "refunds", "orders", ""} {
		require.NoError(t, h(ctx, &inbox.Message{ID: "m-1", IDSpace: space}))
	}
	assert.Equal(t, []string{"orders", "refunds", ""}, ran)
	assert.ErrorIs(t, h(ctx, &inbox.Message{ID: "m-1"}), nil)
	_, err := f.in.Process(ctx, "bad\x1fname", "m-1", effectTx("x", "y"))
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
}

// ExampleInbox records each message's id in the transaction of its effect,
// so a redelivery runs nothing.
func ExampleInbox() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db-primary/app")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	in := postgres.NewInbox(pool)
	handle := in.Handle("ledger", func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error {
		_, err := tx.Exec(ctx, "INSERT INTO ledger (message_id, body) VALUES ($1, $2)", m.ID, m.Body)
		return err
	})
	_ = handle // give it to an adapter (contrib/kafka, ...): it acks after handle returns nil
}

// TestInboxConcurrentOverlappingBatches runs 8 batches at once over the
// same 50 ids, each in its own order, half of them processed before (so
// that both the all-new first try and the fallback run): each effect once,
// and no batch fails on a deadlock. (Without sorting the ids, this test
// failed with "deadlock detected" in one run of three.)
func TestInboxConcurrentOverlappingBatches(t *testing.T) {
	ctx := context.Background()
	f := newInboxFixture(t)
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%02d", i)
	}
	for _, id := range ids[:25:25] {
		_, err := f.in.Process(ctx, "billing", id, effectTx("billing", id))
		require.NoError(t, err)
	}
	warm(t, f.pool, 16)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		mine := slices.Clone(ids)
		if w%2 == 1 {
			slices.Reverse(mine)
		}
		if w >= 4 {
			mine = mine[25:] // all new, or only if the others have not run yet
		}
		wg.Go(func() {
			_, err := f.in.ProcessBatch(ctx, "billing", mine, func(ctx context.Context, tx pgx.Tx, i int) error {
				return effectTx("billing", mine[i])(ctx, tx)
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, id := range ids {
		assert.Equal(t, 1, f.effects(t, "billing", id), id)
	}
}
