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
	_, err := f.pool.Exec(ctx, `INSERT INTO idemhttp_inbox (consumer, id, processed_at)
SELECT 'billing', 'old-' || i, $1 FROM generate_series(1, 2500) AS i`, time.Now().Add(-2*time.Hour).UnixMicro())
	require.NoError(t, err)
	_, err = f.in.Process(ctx, "billing", "new", effectTx("billing", "new"))
	require.NoError(t, err)
	n, err := f.in.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, int64(2500), n)
	res, err := f.in.Process(ctx, "billing", "new", effectTx("billing", "new"))
	require.NoError(t, err)
	assert.True(t, res.Duplicate)
	_, err = f.in.Prune(ctx, 0)
	assert.Error(t, err)
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
