// Package inboxtest holds the conformance suites of the inbox and the
// models the message core runs against.
//
// The suites, each run by every implementation on its real database or
// broker:
//
//   - [Run]: the database/sql inbox, [inbox.SQL] (SQLite in
//     contrib/sqlite, PostgreSQL in contrib/postgres);
//   - [RunLedger]: every [inbox.Ledger] (the memory one, inbox.SQL's,
//     contrib/postgres's), against the answers the core decides from;
//   - [RunUpgrade]: inbox.SQL reading what the previous release wrote
//     (golden data in testdata/baseline), and agreeing with an instance of
//     it in a rolling deploy;
//   - [RunAdapter]: every broker adapter pinned to the model: scripted
//     scenarios (a poison message, shutdowns, a hung neighbour) must end
//     as they do on the [ModelAdapter].
//
// An implementation's test calls its suite:
//
//	func TestConformance(t *testing.T) {
//		inboxtest.Run(t, func(t *testing.T) *sql.DB { return openEmptyDatabase(t) })
//	}
//
// The models, for plain tests and for the simulator: [Broker], an
// at-least-once broker that counts every delivery as quorum queues,
// JetStream and SQS do (shutdowns, prefetches handed back, crashes,
// duplicated deliveries), with dead-letter destinations and no clock of
// its own; [Store], an inbox database whose transactions commit an id
// and its effect together and exclude each other, with its
// [inbox.Ledger]; and [World], which drives the message core
// ([inbox.Delivery]) over several consumers against them, in virtual
// time, every choice drawn from a seed, and checks the invariants: every
// effect at most once, every message settled (effect or dead letter),
// dead letters only after real handler failures. The simulator makes one
// World per seed ([NewWorld], then [World.Run] or [World.Step] and
// [World.Check]); [WorldConfig.CountShutdowns] plants a bug it must find.
package inboxtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// Run runs the suite, one subtest at a time. open must return a database
// with no inbox or effects table in it (a new SQLite file, a new
// PostgreSQL schema) each time it is called, and close it with t.Cleanup;
// it must allow at least 8 open connections.
func Run(t *testing.T, open func(t *testing.T) *sql.DB) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, f *fixture)
	}{
		{"NewThenDuplicate", testNewThenDuplicate},
		{"ConsumersAreSeparate", testConsumersAreSeparate},
		{"HandlerErrorRollsBackTheID", testHandlerErrorRollsBack},
		{"HandlerPanicRollsBackTheID", testHandlerPanicRollsBack},
		{"ConcurrentRedeliveries", testConcurrentRedeliveries},
		{"Batch", testBatch},
		{"BatchErrorRollsBackAll", testBatchErrorRollsBackAll},
		{"ConcurrentOverlappingBatches", testConcurrentBatches},
		{"BadInput", testBadInput},
		{"LongIDsAreHashed", testLongIDs},
		{"ClosedDatabase", testClosedDatabase},
		{"Handle", testHandle},
		{"IDSpaces", testIDSpaces},
		{"UniqueViolation", testUniqueViolation},
		{"RedeliveredBatchesStayFast", testRedeliveredBatches},
		{"Prune", testPrune},
		{"PruneRefusesShortRetention", testPruneMinimum},
		{"MigrateTwice", testMigrateTwice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := open(t)
			f := &fixture{db: db, in: &inbox.SQL{DB: db, Table: "inboxtest_inbox"}}
			ctx := context.Background()
			require.NoError(t, f.in.Migrate(ctx))
			_, err := db.ExecContext(ctx, "CREATE TABLE inboxtest_effects (consumer text NOT NULL, id text NOT NULL, n integer NOT NULL)")
			require.NoError(t, err)
			tt.fn(t, f)
		})
	}
}

type fixture struct {
	db *sql.DB
	in *inbox.SQL
}

// effect is the business write: one row per execution, so that counting
// rows counts executions.
func effect(consumer, id string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO inboxtest_effects (consumer, id, n) VALUES ($1, $2, 1)", consumer, id)
		return err
	}
}

func (f *fixture) effects(t *testing.T, consumer, id string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow("SELECT count(*) FROM inboxtest_effects WHERE consumer = $1 AND id = $2", consumer, id).Scan(&n))
	return n
}

// eachOnce checks that each of ids had exactly one effect, in one query.
func (f *fixture) eachOnce(t *testing.T, consumer string, ids []string) {
	t.Helper()
	rows, err := f.db.Query("SELECT id, count(*) FROM inboxtest_effects WHERE consumer = $1 GROUP BY id", consumer)
	require.NoError(t, err)
	got := make(map[string]int)
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(t, rows.Err())
	want := make(map[string]int)
	for _, id := range ids {
		want[id] = 1
	}
	assert.Equal(t, want, got)
}

func (f *fixture) recorded(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow("SELECT count(*) FROM inboxtest_inbox").Scan(&n))
	return n
}

func testNewThenDuplicate(t *testing.T, f *fixture) {
	ctx := context.Background()
	res, err := f.in.Process(ctx, "billing", "m-1", effect("billing", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	for range 3 {
		res, err = f.in.Process(ctx, "billing", "m-1", func(context.Context, *sql.Tx) error {
			t.Error("a duplicate must run nothing")
			return nil
		})
		require.NoError(t, err)
		assert.True(t, res.Duplicate)
	}
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"))
}

func testConsumersAreSeparate(t *testing.T, f *fixture) {
	ctx := context.Background()
	for _, c := range []string{"billing", "mailer"} {
		res, err := f.in.Process(ctx, c, "m-1", effect(c, "m-1"))
		require.NoError(t, err)
		assert.False(t, res.Duplicate, c)
		assert.Equal(t, 1, f.effects(t, c, "m-1"), c)
	}
}

// testHandlerErrorRollsBack checks that a failed handler leaves no id
// behind: the redelivery runs it again. (With the id committed in its own
// transaction before the handler, the second Process is a duplicate and
// this test fails.)
func testHandlerErrorRollsBack(t *testing.T, f *fixture) {
	ctx := context.Background()
	boom := errors.New("boom")
	_, err := f.in.Process(ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
		require.NoError(t, effect("billing", "m-1")(ctx, tx))
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, f.effects(t, "billing", "m-1"), "the effect rolled back")
	assert.Zero(t, f.recorded(t), "the id rolled back with it")

	res, err := f.in.Process(ctx, "billing", "m-1", effect("billing", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate, "the redelivery runs")
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"))
}

func testHandlerPanicRollsBack(t *testing.T, f *fixture) {
	ctx := context.Background()
	assert.PanicsWithValue(t, "boom", func() {
		_, _ = f.in.Process(ctx, "billing", "m-1", func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, effect("billing", "m-1")(ctx, tx))
			panic("boom")
		})
	})
	assert.Zero(t, f.recorded(t))
	res, err := f.in.Process(ctx, "billing", "m-1", effect("billing", "m-1"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"))
}

// testConcurrentRedeliveries delivers one message 50 times at once, as a
// rebalance or an expired visibility timeout can: one effect. Replacing
// Process's INSERT ... ON CONFLICT in the effect's transaction with a
// SELECT for the id before the transaction (check-then-write) made this
// test fail: 38 effects on PostgreSQL, 2 on SQLite. The checkThenWrite
// baseline beside it shows the same failure in every run.
func testConcurrentRedeliveries(t *testing.T, f *fixture) {
	ctx := context.Background()
	const deliveries = 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	var dups int
	var errs []error
	for range deliveries {
		wg.Go(func() {
			res, err := f.in.Process(ctx, "billing", "m-1", effect("billing", "m-1"))
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
	wg.Wait()
	require.Empty(t, errs)
	assert.Equal(t, 1, f.effects(t, "billing", "m-1"), "one effect for 50 deliveries")
	assert.Equal(t, deliveries-1, dups)

	// The baseline: check, then write, with the same 50 deliveries.
	for range deliveries {
		wg.Go(func() { _ = checkThenWrite(ctx, f.db, "naive", "m-1") })
	}
	wg.Wait()
	t.Logf("check-then-write: %d effects for %d deliveries (the inbox: %d)", f.effects(t, "naive", "m-1"), deliveries, f.effects(t, "billing", "m-1"))
}

// checkThenWrite is the tempting wrong design: look for the id, and if it
// is absent run the effect and record the id. Two deliveries that check
// before either writes both run the effect.
func checkThenWrite(ctx context.Context, db *sql.DB, consumer, id string) error {
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM inboxtest_effects WHERE consumer = $1 AND id = $2", consumer, id).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err := db.ExecContext(ctx, "INSERT INTO inboxtest_effects (consumer, id, n) VALUES ($1, $2, 1)", consumer, id)
	return err
}

func testBatch(t *testing.T, f *fixture) {
	ctx := context.Background()
	_, err := f.in.Process(ctx, "billing", "m-2", effect("billing", "m-2"))
	require.NoError(t, err)

	ids := []string{"m-1", "m-2", "m-3", "m-1", strings.Repeat("x", 300)}
	for i := 4; i < 1200; i++ { // more than one INSERT's worth
		ids = append(ids, fmt.Sprintf("bulk-%d", i))
	}
	var ran []int
	res, err := f.in.ProcessBatch(ctx, "billing", ids, func(ctx context.Context, tx *sql.Tx, i int) error {
		ran = append(ran, i)
		return effect("billing", ids[i])(ctx, tx)
	})
	require.NoError(t, err)
	require.Len(t, res, len(ids))
	assert.False(t, res[0].Duplicate)
	assert.True(t, res[1].Duplicate, "processed before the batch")
	assert.False(t, res[2].Duplicate)
	assert.True(t, res[3].Duplicate, "earlier in the same batch")
	assert.False(t, res[4].Duplicate)
	assert.Len(t, ran, len(ids)-2)
	assert.Equal(t, []int{0, 2, 4, 5}, ran[:4], "in order")
	f.eachOnce(t, "billing", ids)

	res, err = f.in.ProcessBatch(ctx, "billing", ids, func(context.Context, *sql.Tx, int) error {
		t.Error("a batch of duplicates runs nothing")
		return nil
	})
	require.NoError(t, err)
	for i, r := range res {
		assert.True(t, r.Duplicate, i)
	}

	res, err = f.in.ProcessBatch(ctx, "billing", nil, nil)
	require.NoError(t, err)
	assert.Empty(t, res)
}

// testConcurrentOverlappingBatches runs 8 batches at once, each of the
// same 50 ids in its own order (as redeliveries to several consumers
// after a rebalance would be): each id's effect runs once, and no batch
// fails (a deadlock between batches would fail one).
func testConcurrentBatches(t *testing.T, f *fixture) {
	ctx := context.Background()
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = fmt.Sprintf("m-%02d", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		mine := slices.Clone(ids)
		rand.New(rand.NewPCG(uint64(w), 1)).Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
		wg.Go(func() {
			_, err := f.in.ProcessBatch(ctx, "billing", mine, func(ctx context.Context, tx *sql.Tx, i int) error {
				return effect("billing", mine[i])(ctx, tx)
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	f.eachOnce(t, "billing", ids)
}

func testBatchErrorRollsBackAll(t *testing.T, f *fixture) {
	ctx := context.Background()
	boom := errors.New("boom")
	ids := []string{"m-1", "m-2", "m-3"}
	_, err := f.in.ProcessBatch(ctx, "billing", ids, func(ctx context.Context, tx *sql.Tx, i int) error {
		if i == 2 {
			return boom
		}
		return effect("billing", ids[i])(ctx, tx)
	})
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, f.recorded(t))
	assert.Zero(t, f.effects(t, "billing", "m-1"))
}

func testBadInput(t *testing.T, f *fixture) {
	ctx := context.Background()
	never := func(context.Context, *sql.Tx) error {
		t.Error("nothing may run")
		return nil
	}
	tests := []struct {
		give     func() error
		want     error
		wantText string
	}{
		{
			give: func() error { _, err := f.in.Process(ctx, "billing", "", never); return err },
			want: inbox.ErrNoMessageID,
		},
		{
			give: func() error {
				_, err := f.in.ProcessBatch(ctx, "billing", []string{"a", ""}, func(context.Context, *sql.Tx, int) error { return never(ctx, nil) })
				return err
			},
			want: inbox.ErrNoMessageID, wantText: "message 1 of the batch",
		},
		{
			give: func() error { _, err := f.in.Process(ctx, "", "m-1", never); return err },
			want: inbox.ErrInvalidConsumer,
		},
		{
			give: func() error { _, err := f.in.Process(ctx, "bad\x00name", "m-1", never); return err },
			want: inbox.ErrInvalidConsumer,
		},
		{
			give: func() error {
				in := &inbox.SQL{DB: f.db, Table: "inbox; DROP TABLE inboxtest_effects"}
				_, err := in.Process(ctx, "billing", "m-1", never)
				return err
			},
			want: inbox.ErrInvalidTable,
		},
	}
	for i, tt := range tests {
		err := tt.give()
		assert.ErrorIs(t, err, tt.want, i)
		if tt.wantText != "" {
			assert.ErrorContains(t, err, tt.wantText, i)
		}
	}
	assert.Zero(t, f.recorded(t))
}

// testLongIDs checks that ids too long for the key, or not UTF-8, are
// stored hashed and still dedup, and that two long ids sharing a prefix
// are not merged (as truncation would merge them).
func testLongIDs(t *testing.T, f *fixture) {
	ctx := context.Background()
	a := strings.Repeat("a", 5000) + "-1"
	b := strings.Repeat("a", 5000) + "-2"
	bin := "\xff\x00binary"
	for _, id := range []string{a, b, bin} {
		res, err := f.in.Process(ctx, "billing", id, effect("billing", inbox.StoredID(id)))
		require.NoError(t, err)
		assert.False(t, res.Duplicate)
		res, err = f.in.Process(ctx, "billing", id, effect("billing", inbox.StoredID(id)))
		require.NoError(t, err)
		assert.True(t, res.Duplicate)
		assert.Equal(t, 1, f.effects(t, "billing", inbox.StoredID(id)))
	}
	var stored []string
	rows, err := f.db.Query("SELECT id FROM inboxtest_inbox ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		stored = append(stored, s)
	}
	require.NoError(t, rows.Err())
	require.Len(t, stored, 3)
	for _, s := range stored {
		assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, s)
	}
}

// testClosedDatabase checks that a closed database is an error, not a
// duplicate (which would ack a message that never ran).
func testClosedDatabase(t *testing.T, f *fixture) {
	ctx := context.Background()
	require.NoError(t, f.db.Close())
	res, err := f.in.Process(ctx, "billing", "m-1", func(context.Context, *sql.Tx) error {
		t.Error("nothing may run")
		return nil
	})
	assert.Error(t, err)
	assert.False(t, res.Duplicate)
	_, err = f.in.ProcessBatch(ctx, "billing", []string{"m-1", "m-2"}, func(context.Context, *sql.Tx, int) error { return nil })
	assert.Error(t, err)
	_, err = f.in.Prune(ctx, inbox.DefaultMinRetention)
	assert.Error(t, err)
}

func testHandle(t *testing.T, f *fixture) {
	ctx := context.Background()
	var ran int
	h := f.in.Handle("billing", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		ran++
		return effect("billing", m.ID)(ctx, tx)
	})
	m := &inbox.Message{ID: "m-1", Body: []byte("hello")}
	require.NoError(t, h(ctx, m))
	require.NoError(t, h(ctx, m), "a duplicate is acked")
	assert.Equal(t, 1, ran)
	assert.ErrorIs(t, h(ctx, &inbox.Message{}), inbox.ErrNoMessageID)
	assert.Equal(t, 1, ran)
}

// testIDSpaces checks that Handle records ids per id space: the same id
// from two queues runs twice, from one queue once, and two adapters that
// declare one id space share it. (With Handle ignoring m.IDSpace, the
// second queue's message was taken for a duplicate: this test failed.)
func testIDSpaces(t *testing.T, f *fixture) {
	ctx := context.Background()
	var ran []string
	h := f.in.Handle("billing", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		ran = append(ran, m.IDSpace)
		return effect("billing", m.IDSpace+"/"+m.ID)(ctx, tx)
	})
	for _, space := range []string{"orders", "refunds", "orders", ""} {
		require.NoError(t, h(ctx, &inbox.Message{ID: "m-1", IDSpace: space}))
	}
	assert.Equal(t, []string{"orders", "refunds", ""}, ran, "once per id space")
	var consumers []string
	rows, err := f.db.Query("SELECT consumer FROM inboxtest_inbox")
	require.NoError(t, err)
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		consumers = append(consumers, c)
	}
	require.NoError(t, rows.Err())
	slices.Sort(consumers) // in Go: a collation may order control characters otherwise
	assert.Equal(t, []string{"billing", "billing\x1forders", "billing\x1frefunds"}, consumers)
	_, err = inbox.StoredConsumer("bill\x1fing", "orders")
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer, "a consumer name cannot forge an id space")
}

// testUniqueViolation checks that the driver's unique violations are
// recognised (IsUniqueViolation), which is what keeps ProcessBatch's plain
// insert, the fast path, in use after a batch meets a recorded id.
func testUniqueViolation(t *testing.T, f *fixture) {
	ctx := context.Background()
	_, err := f.db.ExecContext(ctx, "INSERT INTO inboxtest_inbox (consumer, id, processed_at) VALUES ('c', 'x', 0)")
	require.NoError(t, err)
	_, err = f.db.ExecContext(ctx, "INSERT INTO inboxtest_inbox (consumer, id, processed_at) VALUES ('c', 'x', 0)")
	require.Error(t, err)
	assert.True(t, inbox.IsUniqueViolation(err), "%T: %v", err, err)
	assert.True(t, inbox.IsUniqueViolation(fmt.Errorf("wrapped: %w", err)))
	_, err = f.db.ExecContext(ctx, "INSERT INTO inboxtest_missing (x) VALUES (1)")
	require.Error(t, err)
	assert.False(t, inbox.IsUniqueViolation(err), "%T: %v", err, err)
}

// testRedeliveredBatches runs batches that meet recorded ids in turn with
// new ones, concurrently: every result is right whichever insert recorded
// it.
func testRedeliveredBatches(t *testing.T, f *fixture) {
	ctx := context.Background()
	for round := range 4 {
		ids := make([]string, 20)
		for i := range ids {
			ids[i] = fmt.Sprintf("r%d-%d", round, i)
		}
		if round%2 == 1 {
			ids[7] = "r0-7" // recorded in round 0
		}
		res, err := f.in.ProcessBatch(ctx, "billing", ids, func(ctx context.Context, tx *sql.Tx, i int) error {
			return effect("billing", ids[i])(ctx, tx)
		})
		require.NoError(t, err)
		for i, r := range res {
			assert.Equal(t, round%2 == 1 && i == 7, r.Duplicate, "round %d, message %d", round, i)
		}
	}
	assert.Equal(t, 1, f.effects(t, "billing", "r0-7"))
	assert.Equal(t, 78, f.recorded(t))
}

func testPrune(t *testing.T, f *fixture) {
	ctx := context.Background()
	f.in.MinRetention = time.Hour
	// Two hours old by the database's clock (Process stamps ids with it),
	// whatever this process's clock says: backdate the ids Process wrote.
	ids := make([]string, 2500)
	for i := range ids {
		ids[i] = fmt.Sprintf("old-%d", i)
	}
	_, err := f.in.ProcessBatch(ctx, "billing", ids, func(context.Context, *sql.Tx, int) error { return nil })
	require.NoError(t, err)
	_, err = f.db.ExecContext(ctx, "UPDATE inboxtest_inbox SET processed_at = processed_at - $1", (2 * time.Hour).Microseconds())
	require.NoError(t, err)
	_, err = f.in.Process(ctx, "billing", "new", effect("billing", "new"))
	require.NoError(t, err)

	n, err := f.in.Prune(ctx, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, int64(2500), n, "more than one chunk")
	assert.Equal(t, 1, f.recorded(t))
	res, err := f.in.Process(ctx, "billing", "new", effect("billing", "new"))
	require.NoError(t, err)
	assert.True(t, res.Duplicate, "a recent id survives")
}

// testPruneMinimum checks that Prune never deletes ids younger than the
// minimum retention: a shorter olderThan is refused and deletes nothing.
// (With the check removed, Prune(ctx, time.Second) deleted the two-hour-old
// id: this test failed.)
func testPruneMinimum(t *testing.T, f *fixture) {
	ctx := context.Background()
	_, err := f.in.Process(ctx, "billing", "m-1", effect("billing", "m-1"))
	require.NoError(t, err)
	_, err = f.db.ExecContext(ctx, "UPDATE inboxtest_inbox SET processed_at = processed_at - $1", (2 * time.Hour).Microseconds())
	require.NoError(t, err)
	tests := []struct {
		give    time.Duration
		minimum time.Duration
	}{
		{give: time.Second},
		{give: 0},
		{give: -time.Hour},
		{give: inbox.DefaultMinRetention - time.Second},
		{give: time.Hour, minimum: 3 * time.Hour},
	}
	for _, tt := range tests {
		f.in.MinRetention = tt.minimum
		n, err := f.in.Prune(ctx, tt.give)
		assert.ErrorIs(t, err, inbox.ErrRetention, tt.give)
		assert.Zero(t, n)
	}
	assert.Equal(t, 1, f.recorded(t), "nothing deleted")
}

func testMigrateTwice(t *testing.T, f *fixture) {
	require.NoError(t, f.in.Migrate(context.Background()))
	s, err := f.in.Schema()
	require.NoError(t, err)
	assert.Contains(t, s, "CREATE TABLE IF NOT EXISTS inboxtest_inbox")
}
