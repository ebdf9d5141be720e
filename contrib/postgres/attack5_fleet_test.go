package postgres_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// splitDB is a pool that sends Begin's two-statement pipeline (the insert,
// then takeSQL, recognised by its "took AS") as two batches, and calls
// between runs between them, once: a test's way into the gap between the
// insert's conflict and takeSQL's snapshot, which the pipeline makes
// narrow but not empty.
type splitDB struct {
	*pgxpool.Pool
	once    sync.Once
	between func()
}

func (d *splitDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	qs := b.QueuedQueries
	if len(qs) != 2 || !strings.Contains(qs[1].SQL, "took AS") {
		return d.Pool.SendBatch(ctx, b)
	}
	split := false
	d.once.Do(func() { split = true })
	if !split {
		return d.Pool.SendBatch(ctx, b)
	}
	first, second := &pgx.Batch{}, &pgx.Batch{}
	first.Queue(qs[0].SQL, qs[0].Arguments...)
	second.Queue(qs[1].SQL, qs[1].Arguments...)
	return &splitResults{ctx: ctx, d: d, first: d.Pool.SendBatch(ctx, first), second: second}
}

// splitResults reads the first batch's one result, then runs the hook and
// sends the second batch.
type splitResults struct {
	ctx    context.Context
	d      *splitDB
	first  pgx.BatchResults
	second *pgx.Batch
	cur    pgx.BatchResults
	n      int
}

func (r *splitResults) next() pgx.BatchResults {
	r.n++
	if r.n == 1 {
		return r.first
	}
	if r.cur == nil {
		_ = r.first.Close()
		r.d.between()
		r.cur = r.d.Pool.SendBatch(r.ctx, r.second)
	}
	return r.cur
}

func (r *splitResults) Exec() (pgconn.CommandTag, error) { return r.next().Exec() }
func (r *splitResults) Query() (pgx.Rows, error)         { return r.next().Query() }
func (r *splitResults) QueryRow() pgx.Row                { return r.next().QueryRow() }
func (r *splitResults) Tx() pgx.Tx                       { return nil }
func (r *splitResults) Close() error {
	err := r.first.Close()
	if r.cur != nil {
		if cerr := r.cur.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// TestAttack5BeginTakesAWithdrawnEntry: two workers run one operation
// (two instances handling the same event). A's Do began it under its key
// and its one attempt was refused at the dial, so A withdraws the entry
// (Delete) and tells its caller ErrNotSent. B's Do of the same operation
// meets the entry: its insert conflicts, then takeSQL reads the entry and
// goes to lease it, and waits on the row lock of A's Delete. A's Delete
// commits: the lease matches no row any more, but takeSQL still returned
// the entry it read, pending, and B's Client sent it under A's key. A's
// caller, told nothing ran, retries under a new key: the operation runs
// twice. Fixed: takeSQL says when it did not lease a pending entry it
// should have (the row changed under it), and Begin reads again, which
// inserts B's own entry.
//
// Checked to fail with the missed column forced to false in takeSQL:
// B's Begin returned the withdrawn entry "k", which no longer exists.
func TestAttack5BeginTakesAWithdrawnEntry(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	a := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{Worker: "a", Lease: time.Minute})
	existing, err := a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	require.Nil(t, existing)

	admin, watcher := s.admin(t), s.admin(t)
	var pid uint32
	require.NoError(t, admin.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	committed := make(chan error, 1)
	d := &splitDB{Pool: s.pool(t, 0), between: func() {
		// A's Delete, as deleteSQL runs it, left open until B's lease
		// waits for its row lock.
		tx, err := admin.Begin(ctx)
		require.NoError(t, err)
		tag, err := tx.Exec(ctx, "DELETE FROM "+s.name+".idemhttp_journal WHERE key = 'k' AND state = 'pending' AND attempts = 0")
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		go func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				if err := watcher.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", int(pid)).Scan(&n); err != nil || n > 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			committed <- tx.Commit(ctx)
		}()
	}}
	b := postgres.NewJournal(d, &postgres.JournalOptions{Worker: "b", Lease: time.Minute})
	mine := entry("k")
	mine.Key = "k-b" // B's Client minted its own key for the operation
	existing, err = b.Begin(ctx, mine)
	require.NoError(t, err)
	require.NoError(t, <-committed)

	if existing != nil {
		_, gerr := a.Get(ctx, existing.Key)
		assert.NoError(t, gerr, "B's Begin handed its Client entry %s (%s) to send, which A withdrew: A's caller was told nothing ran", existing.Key, existing.State)
		return
	}
	got, err := b.Lookup(ctx, "op-k")
	require.NoError(t, err)
	assert.Equal(t, "k-b", got.Key, "B's own entry, leased to B")
}

// TestAttack5PreviousReleaseDeleteRemovesAnything: in a rolling deploy, a
// worker of commit 2d053bb withdraws with its own statement, verbatim
// below: DELETE by key alone. Not only an abandoned entry or one nobody
// holds (as the Delete doc and doc.go said), but a pending entry another
// (new) worker leased and is sending, and a done one. Its Client calls it
// only for a call that stopped before its first attempt (a
// PrepareRequest error), so this needs that call to stall past its lease
// while a new worker claims and sends the entry; its caller is then told
// nothing was sent. Accepted limit of the rolling deploy (nothing the new
// release writes can stop a statement of the old one); the docs now say
// what the old statement removes. This test is the record of it.
func TestAttack5PreviousReleaseDeleteRemovesAnything(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	a, b, shift := fleet(t, s)
	const previousDelete = `DELETE FROM idemhttp_journal WHERE key = $1` // 2d053bb's Journal.Delete
	old := s.skewedPool(t, 0)

	for _, k := range []string{"leased", "done"} {
		existing, err := a.Begin(ctx, entry(k)) // as the old worker's Begin would
		require.NoError(t, err)
		require.Nil(t, existing)
	}
	shift(2 * time.Minute)
	require.ElementsMatch(t, []string{"leased", "done"}, claim(t, b, 10))
	require.NoError(t, b.Finish(ctx, "done", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))

	for _, k := range []string{"leased", "done"} {
		tag, err := old.Exec(ctx, previousDelete, k)
		require.NoError(t, err)
		assert.EqualValues(t, 1, tag.RowsAffected(), "the previous release's Delete removes %s", k)
	}
	err := b.Finish(ctx, "leased", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
	assert.ErrorIs(t, err, idemhttp.ErrNotFound, "the new worker's send is left without its entry")
}

// TestAttack5ClearedDoubtComesBack: the docs tell an operator to clear a
// wrong mark and the doubt with DELETE FROM idemhttp_journal_clock once
// the entries are resolved. A running worker keeps the latest time it
// recorded in memory and puts it back as the mark, and as the doubt,
// the next time it reads the clock: the clear holds only once every
// worker that recorded the times has restarted. Fail closed (the entries
// stay refused), so not a double run; the docs now say so. This test is
// the record of it.
func TestAttack5ClearedDoubtComesBack(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	a, b, shift := fleet(t, s)
	shift(2 * time.Hour) // the database's clock ahead, then put right
	existing, err := a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	require.Nil(t, existing)
	shift(-2 * time.Hour)
	doubt, err := a.ClockDoubt(ctx)
	require.NoError(t, err)
	require.False(t, doubt.IsZero(), "the set-back is seen")

	_, err = s.admin(t).Exec(ctx, "DELETE FROM "+s.name+".idemhttp_journal_clock")
	require.NoError(t, err)
	doubt, err = b.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.True(t, doubt.IsZero(), "cleared, for a worker that recorded nothing")
	doubt, err = a.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.False(t, doubt.IsZero(), "the worker that recorded the times puts the doubt back")
	doubt, err = b.ClockDoubt(ctx)
	require.NoError(t, err)
	assert.False(t, doubt.IsZero(), "and the whole fleet sees it again")
}

// TestAttack5PreviousReleaseRerunTakesNoLease: in a rolling deploy, a
// worker of commit 2d053bb that runs an operation a new worker began (two
// instances handling one event) finds the pending entry with its Begin,
// verbatim below, and sends it under its key, but writes no lease: its
// Begin takes none. The new worker's Delete fence (its own token, no
// attempt recorded) cannot see that send, so a new worker whose own
// attempt was refused at the dial withdraws the entry and tells its
// caller ErrNotSent, and the caller's retry under a new key runs the
// operation a second time. Accepted limit of the rolling deploy (the old
// worker writes nothing a fence could read; 2d053bb's workers had the
// same hole among themselves); the docs now name it. This test is the
// record of it.
func TestAttack5PreviousReleaseRerunTakesNoLease(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "new", Lease: time.Minute})
	e := entry("k")
	existing, err := a.Begin(ctx, e)
	require.NoError(t, err)
	require.Nil(t, existing)

	// 2d053bb's Begin of the same operation under the old worker's own
	// minted key: the insert conflicts, the read finds the entry.
	const previousBegin = `
INSERT INTO idemhttp_journal (key, operation, method, url, header, body, fingerprint, state,
    created_at, updated_at, attempts, last_status, lease_owner, lease_token, lease_expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', coalesce($8, now()), coalesce($9, now()), $10, $11, $12,
    CASE WHEN $12::text IS NULL THEN NULL ELSE $14 END,
    CASE WHEN $12::text IS NULL THEN NULL ELSE now() + $13::interval END)
ON CONFLICT DO NOTHING
RETURNING true`
	var inserted bool
	err = pool.QueryRow(ctx, previousBegin, "k-old", e.Operation, e.Method, e.URL, []byte(`{}`), e.Body, "fp",
		nil, nil, 0, 0, "old", time.Minute, "old-token").Scan(&inserted)
	require.ErrorIs(t, err, pgx.ErrNoRows, "the old Begin conflicts on the operation")
	var key, state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT key, state FROM idemhttp_journal WHERE key = $1 OR operation = $2
ORDER BY operation IS NOT DISTINCT FROM $2 DESC LIMIT 1`, "k-old", e.Operation).Scan(&key, &state))
	require.Equal(t, "k", key, "the old worker sends the new worker's entry, under its key")

	assert.NoError(t, a.Delete(ctx, "k"), "the new worker's withdrawal cannot see the old worker's send")
}
