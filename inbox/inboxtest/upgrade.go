package inboxtest

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// baseline holds what the previous release (commit 2d053bb) wrote: its
// inbox table on SQLite and on PostgreSQL, and the ids it recorded. See
// testdata/baseline/README.md for how it was made.
//
//go:embed testdata/baseline/sqlite.sql testdata/baseline/postgres.sql testdata/baseline/manifest.json
var baseline embed.FS

// Manifest lists what a release recorded in golden data: the ids per
// consumer, each quoted as [strconv.Quote] does (an id need not be
// UTF-8), and the ids of the outbox's messages, when it has one.
type Manifest struct {
	Processed map[string][]string `json:"processed"`
	Outbox    []string            `json:"outbox,omitempty"`
}

// IDs returns the ids of consumer, unquoted.
func (m Manifest) IDs(t testing.TB, consumer string) []string {
	t.Helper()
	out := make([]string, 0, len(m.Processed[consumer]))
	for _, q := range m.Processed[consumer] {
		id, err := strconv.Unquote(q)
		require.NoError(t, err, q)
		out = append(out, id)
	}
	return out
}

// ReadManifest reads a manifest written with golden data.
func ReadManifest(t testing.TB, b []byte) Manifest {
	t.Helper()
	var m Manifest
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// The statement with which the previous release recorded an id (its
// insertIDs, for one id), sent verbatim by the tests that play one of its
// instances beside this release in a rolling deploy.
const oldInsert = "INSERT INTO idemhttp_inbox (consumer, id, processed_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"

// RunUpgrade runs the upgrade suite of [inbox.SQL] on engine ("sqlite" or
// "postgres"): the previous release's table and rows (golden data) are
// loaded into the empty database open returns (as [Run]'s), and this
// release must upgrade the table in place, take every id recorded then
// for a duplicate in any id space, and agree with an instance of the
// previous release running beside it on every message id.
func RunUpgrade(t *testing.T, engine string, open func(t *testing.T) *sql.DB) {
	t.Helper()
	dump, err := baseline.ReadFile("testdata/baseline/" + engine + ".sql")
	require.NoError(t, err, "engine %q", engine)
	raw, err := baseline.ReadFile("testdata/baseline/manifest.json")
	require.NoError(t, err)
	m := ReadManifest(t, raw)
	tests := []struct {
		name string
		fn   func(t *testing.T, f *upgradeFixture)
	}{
		{"MigrateInPlace", testMigrateInPlace},
		{"OldIDsStayDuplicates", testOldIDsStayDuplicates},
		{"NewIDsOncePerSpace", testNewIDsOncePerSpace},
		{"OldInstanceSeesNewRecords", testOldInstanceSeesNewRecords},
		{"TombstoneOnUpgradedTable", testTombstoneUpgraded},
	}
	if engine == "postgres" {
		tests = append(tests, struct {
			name string
			fn   func(t *testing.T, f *upgradeFixture)
		}{"RollingDeployWaitsOnOneRow", testRollingDeploy})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db := open(t)
			_, err := db.Exec(string(dump))
			require.NoError(t, err, "load the previous release's table")
			f := &upgradeFixture{db: db, in: &inbox.SQL{DB: db}, m: m}
			require.NoError(t, f.in.Migrate(context.Background()), "upgrade in place")
			tt.fn(t, f)
		})
	}
}

type upgradeFixture struct {
	db *sql.DB
	in *inbox.SQL
	m  Manifest
}

func (f *upgradeFixture) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow(q, args...).Scan(&n))
	return n
}

// Migrate adds the format column, marking every old row as the previous
// release's, creates the ledger, loses no row, and runs again. (With
// Migrate only creating what is missing, the format column never came and
// every statement of this release failed: this test failed.)
func testMigrateInPlace(t *testing.T, f *upgradeFixture) {
	want := len(f.m.Processed["billing"]) + len(f.m.Processed["mailer"])
	assert.Equal(t, want, f.count(t, "SELECT count(*) FROM idemhttp_inbox"))
	assert.Equal(t, want, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE format = 1"), "every old row is the previous release's")
	assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox_ledger"))
	require.NoError(t, f.in.Migrate(context.Background()), "again")
	assert.Equal(t, want, f.count(t, "SELECT count(*) FROM idemhttp_inbox"))
}

// Every id the previous release recorded is a duplicate after the
// upgrade, whichever way it comes in: Process and ProcessBatch under the
// consumer's name, Handle from a queue (an id space, as every adapter now
// sets), and the ledger's OpBegin says processed. (With Handle recording
// ids under the id space only, every old id ran again: this test failed.)
func testOldIDsStayDuplicates(t *testing.T, f *upgradeFixture) {
	ctx := context.Background()
	never := func(context.Context, *sql.Tx) error {
		t.Error("an id recorded before the upgrade ran again")
		return nil
	}
	for consumer := range f.m.Processed {
		ids := f.m.IDs(t, consumer)
		for _, id := range ids {
			res, err := f.in.Process(ctx, consumer, id, never)
			require.NoError(t, err)
			assert.True(t, res.Duplicate, "%s %q", consumer, id)
			for _, space := range []string{"orders", "refunds", ""} {
				h := f.in.Handle(consumer, func(context.Context, *sql.Tx, *inbox.Message) error { return never(ctx, nil) })
				require.NoError(t, h(ctx, &inbox.Message{ID: id, IDSpace: space}))
				rec, err := f.in.Ledger(consumer).Apply(ctx, inbox.Key{IDSpace: space, ID: id}, inbox.OpBegin)
				require.NoError(t, err)
				assert.True(t, rec.Processed, "%s %q in %q", consumer, id, space)
				rec, err = f.in.Ledger(consumer).Apply(ctx, inbox.Key{IDSpace: space, ID: id}, inbox.OpTombstone)
				require.NoError(t, err)
				assert.Equal(t, inbox.Record{Processed: true}, rec, "no tombstone over the previous release's record: %s %q in %q", consumer, id, space)
			}
		}
		res, err := f.in.ProcessBatch(ctx, consumer, ids, func(context.Context, *sql.Tx, int) error { return never(ctx, nil) })
		require.NoError(t, err)
		for i, r := range res {
			assert.True(t, r.Duplicate, "%s %q", consumer, ids[i])
		}
	}
	assert.Zero(t, f.count(t, "SELECT count(*) FROM idemhttp_inbox_ledger"), "no marker left for a processed message")
}

// After the upgrade a new id runs once per id space: its own row
// (format 2) and, for the previous release's instances, its copy under
// the consumer's name (format 3), which neither another id space nor the
// empty one takes for a record of its own. (With the copy written in
// format 2, refunds' m-1 was a duplicate of orders': this test failed.)
func testNewIDsOncePerSpace(t *testing.T, f *upgradeFixture) {
	ctx := context.Background()
	var ran []string
	h := f.in.Handle("billing", func(_ context.Context, _ *sql.Tx, m *inbox.Message) error {
		ran = append(ran, m.IDSpace)
		return nil
	})
	for _, space := range []string{"orders", "orders", "refunds", "", "", "refunds"} {
		require.NoError(t, h(ctx, &inbox.Message{ID: "fresh-1", IDSpace: space}))
	}
	assert.Equal(t, []string{"orders", "refunds", ""}, ran)
	assert.Equal(t, 1, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE consumer = 'billing' AND id = 'fresh-1' AND format = 2"),
		"the empty space took the copy over")
	assert.Equal(t, 2, f.count(t, "SELECT count(*) FROM idemhttp_inbox WHERE consumer <> 'billing' AND id = 'fresh-1' AND format = 2"))
	res, err := f.in.ProcessBatch(ctx, "billing", []string{"fresh-1", "fresh-2"}, func(context.Context, *sql.Tx, int) error { return nil })
	require.NoError(t, err)
	assert.Equal(t, []inbox.Result{{Duplicate: true}, {}}, res)
}

// An instance of the previous release, running beside this one, takes a
// message this release processed for a duplicate: its insert finds the
// copy. (With no copy written, the old instance ran it again: this test
// failed.)
func testOldInstanceSeesNewRecords(t *testing.T, f *upgradeFixture) {
	ctx := context.Background()
	h := f.in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
	require.NoError(t, h(ctx, &inbox.Message{ID: "fresh-3", IDSpace: "orders"}))
	r, err := f.db.ExecContext(ctx, oldInsert, "billing", "fresh-3", time.Now().UnixMicro())
	require.NoError(t, err)
	n, err := r.RowsAffected()
	require.NoError(t, err)
	assert.Zero(t, n, "the old instance sees the message processed")
}

// A dead letter's tombstone (format 4) on the upgraded table: the
// effect's transaction meets it, a redrive clears it, and an instance of
// the previous release takes it for a processed id (its insert finds the
// row: documented in docs/consumer.md). (With recordOne not reading
// format 4, the effect ran: this test failed.)
func testTombstoneUpgraded(t *testing.T, f *upgradeFixture) {
	ctx := context.Background()
	l := f.in.Ledger("billing")
	k := inbox.Key{ID: "fresh-4"}
	rec, err := l.Apply(ctx, k, inbox.OpTombstone)
	require.NoError(t, err)
	assert.Equal(t, inbox.Record{DeadLettered: true}, rec)
	h := f.in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error {
		t.Error("the effect ran after the tombstone")
		return nil
	})
	assert.ErrorIs(t, h(ctx, &inbox.Message{ID: "fresh-4"}), inbox.ErrDeadLettered)
	r, err := f.db.ExecContext(ctx, oldInsert, "billing", "fresh-4", time.Now().UnixMicro())
	require.NoError(t, err)
	n, err := r.RowsAffected()
	require.NoError(t, err)
	assert.Zero(t, n, "the old instance's insert finds the row")
	was, err := l.Redrive(ctx, k)
	require.NoError(t, err)
	assert.True(t, was)
	ran := false
	h = f.in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error { ran = true; return nil })
	require.NoError(t, h(ctx, &inbox.Message{ID: "fresh-4"}))
	assert.True(t, ran, "the redriven message runs")
}

// An old and a new instance given the same message at once wait on one
// row, in either order, and the effect runs once. (With this release only
// reading the legacy row, the new instance ran beside the old one's
// uncommitted insert: the first case failed.)
func testRollingDeploy(t *testing.T, f *upgradeFixture) {
	ctx := context.Background()
	t.Run("old first", func(t *testing.T) {
		old, err := f.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer old.Rollback()
		var oldPID int
		require.NoError(t, old.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&oldPID))
		_, err = old.ExecContext(ctx, oldInsert, "billing", "race-1", time.Now().UnixMicro())
		require.NoError(t, err)
		ran := make(chan struct{}, 1)
		done := make(chan error, 1)
		h := f.in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error { ran <- struct{}{}; return nil })
		go func() { done <- h(ctx, &inbox.Message{ID: "race-1", IDSpace: "orders"}) }()
		waitBlockedBy(t, f.db, oldPID)
		require.NoError(t, old.Commit())
		require.NoError(t, <-done)
		assert.Empty(t, ran, "the new instance waited, then found the old one's record")
	})
	t.Run("new first", func(t *testing.T) {
		pid := make(chan int, 1)
		release := make(chan struct{})
		done := make(chan error, 2)
		h := f.in.Handle("billing", func(ctx context.Context, tx *sql.Tx, _ *inbox.Message) error {
			var p int
			if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&p); err != nil {
				return err
			}
			pid <- p
			<-release
			return nil
		})
		go func() { done <- h(ctx, &inbox.Message{ID: "race-2", IDSpace: "orders"}) }()
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		defer func() { unblock(); <-done }() // also when the test fails: no transaction left open
		var newPID int
		select {
		case newPID = <-pid:
		case err := <-done:
			done <- err
			t.Fatalf("Handle returned before its handler ran: %v", err)
		}
		inserted := make(chan int64, 1)
		go func() {
			r, err := f.db.ExecContext(ctx, oldInsert, "billing", "race-2", time.Now().UnixMicro())
			n := int64(-1)
			if err == nil {
				n, _ = r.RowsAffected()
			}
			inserted <- n
		}()
		waitBlockedBy(t, f.db, newPID)
		unblock()
		err := <-done
		done <- err
		require.NoError(t, err)
		assert.Zero(t, <-inserted, "the old instance waited, then found the new one's copy")
	})
}

// waitBlockedBy waits until some backend waits for a lock pid holds.
func waitBlockedBy(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := db.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", pid).Scan(&n)
		return err == nil && n > 0
	}, 10*time.Second, 5*time.Millisecond, "a backend waits on pid %d", pid)
}
