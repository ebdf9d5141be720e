package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp/idemserver"
)

// A request's transaction takes three round trips on a *pgxpool.Pool, as
// many as a handler that begins and commits its own: BEGIN with the claim
// (pgx's Batch.BeginTx), the handler's statements, and the stored
// response with COMMIT (a pipeline on the connection, which goes back to
// the pool once the session is idle). On another DB the response and
// COMMIT take a round trip each.

// The claim is the key's transaction-level advisory lock (a 64-bit hash
// of the key and its table), tried, never waited for: a duplicate of a
// running request answers 409 at once, and neither waits on the runner's
// rows nor holds a connection doing so. The key's row is written once, at
// the end, with the response (storeTxSQL). A first version inserted a
// claim row at the start under a short lock_timeout, then updated it with
// the response: twice the row work, and under load the timeout also fired
// on unrelated waits (relation extension), answering 409 for a free key.
//
// The same statement reads the transaction's start time
// (transaction_timestamp()), which names the transaction on its
// connection: a handler may end it (COMMIT or ROLLBACK through tx.Exec or
// its Conn) and even begin another, and a record written then would commit
// apart from the handler's writes. The statement that writes the record
// (storeGuardSQL) compares it first, and so does the one that goes with a
// rollback (sameTxSQL), to tell a handler that ended the transaction from
// one that failed. A transaction the handler began later starts later: at
// least a round trip after this statement answered. The check costs
// nothing more than this column and a parameter: a first version marked
// the transaction with two settings (one of them reported by the server
// when it changes, the end of the transaction included), which cost a
// dozen allocations and two protocol messages per request.
const txClaimSQL = `SELECT pg_try_advisory_xact_lock($1), ` + txStartSQL

// txStartSQL is the transaction's start in microseconds since 1970, a
// bigint: cheaper to read and send back than a timestamptz (no scan or
// encode plan per request), and computed the same way each time.
const txStartSQL = `(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint`

// sameTxSQL reads whether the connection's transaction is the claim's,
// begun at $1 (txStartSQL).
const sameTxSQL = `SELECT ` + txStartSQL + ` = $1`

// divisionByZero is SQLSTATE 22012, storeGuardSQL's "claim lost".
const divisionByZero = "22012"

// numericOutOfRange is SQLSTATE 22003, storeGuardSQL's "not the claim's
// transaction".
const numericOutOfRange = "22003"

// lookupTxSQL reads the key's live row, if any: a completed response to
// replay, or a claim committed by a [Store] sharing the table. An expired
// row is the claimer's to take over.
const lookupTxSQL = `SELECT token, fingerprint, record FROM idemhttp_keys WHERE key = $1 AND expires_at > now()`

const setIdleTimeoutSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// advisoryKey is the advisory lock of a row key in table (its
// schema-qualified name): the first 8 bytes of the SHA-256 of both.
// Advisory locks are the database's, shared by every schema in it, so a
// hash of the key alone made two applications in separate schemas block
// each other (409) on the same key. Two keys share a lock with odds of
// 2^-64 (then one of them answers 409 while the other runs); an
// application's own advisory locks on small integers never meet it.
func advisoryKey(table string, row []byte) int64 {
	var buf [512]byte // most names and keys fit; longer ones spill to the heap
	b := append(buf[:0], table...)
	b = append(b, 0) // a quoted identifier holds no NUL
	sum := sha256.Sum256(append(b, row...))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// storeTxSQL writes the key's row with the response, in the request's
// transaction, unless a live row holds the key: one that another claimer
// (a Store sharing the table, which takes no advisory lock) committed
// while the handler ran. Then the claim is lost, and the business write
// must not commit: exactly one of the two runs may.
const storeTxSQL = `
INSERT INTO idemhttp_keys AS k (key, token, fingerprint, record, expires_at)
VALUES ($1, $2, $3, $4, now() + $5::interval)
ON CONFLICT (key) DO UPDATE
SET token = excluded.token, fingerprint = excluded.fingerprint, record = excluded.record, expires_at = excluded.expires_at
WHERE k.expires_at <= now()`

// storeGuardSQL is storeTxSQL for a pipeline with COMMIT: it fails unless
// the transaction is the claim's, the one begun at $6 (the largest integer
// plus one: numeric_value_out_of_range), and unless it wrote the row
// (division_by_zero: the claim is lost). Either failure aborts the
// transaction, so the COMMIT queued after it can commit neither the
// business write without its record nor the record in a transaction the
// handler began.
const storeGuardSQL = `
WITH stored AS (` + storeTxSQL + ` RETURNING 1)
SELECT 2147483647 + (` + txStartSQL + ` <> $6)::int, 1 / count(*) FROM stored`

// outcome of begin: what to do with the request.
type claimOutcome int

const (
	claimRun claimOutcome = iota
	claimBusy
	claimCompleted
)

// errClaimLost: the claim's row was not there to store the response in.
var errClaimLost = errors.New("claim lost")

// errTxEnded: the transaction is not the claim's any more.
var errTxEnded = errors.New("the handler ended the transaction")

// txRun is one request's open transaction.
type txRun struct {
	tx     pgx.Tx
	conn   *pgxpool.Conn // the pipelined path's connection, released at the end
	pg     *pgconn.PgConn
	lent   *handlerTx // the handler's view of tx
	closed bool
	began  int64 // the transaction's start (txStartSQL), for a keyed run; 0 without a key
}

// escaped reports whether the connection is outside any transaction, so
// that the handler ended the claim's itself. (One it began anew after is
// found by the statements that compare began.) A connection that died is
// not counted: the server rolled back, and the commit will say that the
// outcome is unknown.
func (run *txRun) escaped() bool {
	pg := run.pg
	return pg != nil && !pg.IsClosed() && pg.TxStatus() == 'I'
}

// end rolls the run back and reports whether the handler had ended the
// claim's transaction itself: the connection outside any transaction, or
// in one begun later. A transaction found aborted is taken for the
// claim's: PostgreSQL answers no statement in it, so a handler that
// committed, began again and left the new transaction aborted is not told
// from one whose statement failed. On a pool the check rides with the
// ROLLBACK, in its round trip.
func (run *txRun) end(ctx context.Context) (ended bool) {
	if run.closed {
		return false
	}
	pg := run.pg
	switch {
	case pg == nil || pg.IsClosed():
		run.rollback(ctx)
		return false
	case pg.TxStatus() == 'I':
		run.rollback(ctx)
		return true
	case pg.TxStatus() == 'E' || run.began == 0: // aborted, or a run without a key
		run.rollback(ctx)
		return false
	}
	var same bool
	if run.conn == nil {
		err := run.tx.QueryRow(ctx, sameTxSQL, run.began).Scan(&same)
		run.rollback(ctx)
		return err == nil && !same
	}
	run.closed = true
	run.lent.close()
	b := &pgx.Batch{}
	b.Queue(sameTxSQL, run.began)
	b.Queue("ROLLBACK")
	br := run.conn.SendBatch(ctx, b)
	err := br.QueryRow().Scan(&same)
	_, _ = br.Exec()
	_ = br.Close()
	if pg.TxStatus() != 'I' {
		_, _ = run.conn.Exec(ctx, "ROLLBACK") // or the connection is destroyed on release, which ends it too
	}
	run.conn.Release()
	return err == nil && !same
}

// aborted reports whether a statement failed in the transaction, which
// can then only roll back.
func (run *txRun) aborted() bool {
	return run.pg != nil && !run.pg.IsClosed() && run.pg.TxStatus() == 'E'
}

type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// begin opens the request's transaction and, for a keyed request, claims
// the key in it, in one round trip. A connection found dead before
// anything ran is replaced and the whole step retried: nothing is
// committed before the end. The run is nil unless the outcome is
// claimRun.
func (h *txHandler) begin(ctx context.Context, c *txClaim) (*txRun, claimOutcome, idemserver.ClaimResult, error) {
	var (
		run     *txRun
		outcome claimOutcome
		res     idemserver.ClaimResult
	)
	err := retry(ctx, func() (err error) {
		run, outcome, res, err = h.beginOnce(ctx, c)
		return err
	})
	if run != nil {
		run.lent = &handlerTx{tx: run.tx}
	}
	return run, outcome, res, err
}

func (h *txHandler) beginOnce(ctx context.Context, c *txClaim) (*txRun, claimOutcome, idemserver.ClaimResult, error) {
	if c != nil && h.m.lookupApart {
		// Under SERIALIZABLE, a read of the key table in the request's
		// transaction takes predicate locks on its index pages, which the
		// other requests' records then write into: two requests with
		// different keys were taken to conflict, and most of a busy
		// server's requests failed with serialization errors (83% of 1600,
		// 16 at a time). So the key is looked up first, at READ
		// COMMITTED, in a round trip of its own. A run that commits
		// between that lookup and the lock makes this one's store fail,
		// and the lookup after its rollback finds the response.
		if outcome, res, err := h.recheck(ctx, c); err != nil || outcome != claimRun {
			return nil, outcome, res, err
		}
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: h.m.isoLevel})
	if h.m.idleTimeout != "" {
		b.Queue(setIdleTimeoutSQL, h.m.idleTimeout)
	}
	if c != nil {
		b.Queue(txClaimSQL, c.lock)
		if !h.m.lookupApart {
			b.Queue(lookupTxSQL, c.row)
		}
	}
	// On a pool, hold the connection itself, so that commit can pipeline
	// the response and COMMIT and then release it.
	var (
		conn *pgxpool.Conn
		br   pgx.BatchResults
	)
	if p, ok := h.m.db.(acquirer); ok {
		var err error
		if conn, err = p.Acquire(ctx); err != nil {
			return nil, 0, idemserver.ClaimResult{}, err
		}
		br = conn.SendBatch(ctx, b)
	} else {
		br = h.m.db.SendBatch(ctx, b)
	}
	tx := br.Tx()
	var began int64
	res, outcome, err := h.readBegin(br, c, &began)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && tx == nil {
		err = errors.New("the DB's SendBatch does not begin transactions (pgx.Batch.BeginTx)")
	}
	if err != nil || outcome != claimRun {
		if tx != nil {
			_ = tx.Rollback(ctx) // ErrTxClosed if the begin failed
		}
		if conn != nil {
			conn.Release() // destroyed unless idle
		}
		return nil, outcome, res, err
	}
	return &txRun{tx: tx, conn: conn, pg: tx.Conn().PgConn(), began: began}, claimRun, idemserver.ClaimResult{State: idemserver.Claimed}, nil
}

// readBegin reads the results of beginOnce's batch: what the claim found,
// and the transaction's start into began.
func (h *txHandler) readBegin(br pgx.BatchResults, c *txClaim, began *int64) (idemserver.ClaimResult, claimOutcome, error) {
	if _, err := br.Exec(); err != nil { // BEGIN
		return idemserver.ClaimResult{}, 0, err
	}
	if h.m.idleTimeout != "" {
		if _, err := br.Exec(); err != nil {
			return idemserver.ClaimResult{}, 0, err
		}
	}
	if c == nil {
		return idemserver.ClaimResult{}, claimRun, nil
	}
	var locked bool
	if err := br.QueryRow().Scan(&locked, began); err != nil {
		return idemserver.ClaimResult{}, 0, err
	}
	if h.m.lookupApart {
		if !locked {
			return idemserver.ClaimResult{State: idemserver.InProgress}, claimBusy, nil
		}
		return idemserver.ClaimResult{State: idemserver.Claimed}, claimRun, nil
	}
	res, outcome, err := readLookup(br.QueryRow(), c.Token)
	if err == nil && !locked {
		// A running request holds the key; whatever row is visible is
		// about to change.
		return idemserver.ClaimResult{State: idemserver.InProgress}, claimBusy, nil
	}
	return res, outcome, err
}

// recheckBatch is lookupTxSQL in a transaction of its own, READ COMMITTED
// whatever the server's default, so that it sees every row committed by
// the time it runs.
var recheckBatch = []string{"BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY", lookupTxSQL, "COMMIT"}

// recheck looks the key up afresh, after the request's transaction has
// rolled back: what a new claim of it would find, short of taking it.
func (h *txHandler) recheck(ctx context.Context, c *txClaim) (claimOutcome, idemserver.ClaimResult, error) {
	var (
		outcome claimOutcome
		res     idemserver.ClaimResult
	)
	err := retry(ctx, func() error {
		b := &pgx.Batch{}
		b.Queue(recheckBatch[0])
		b.Queue(recheckBatch[1], c.row)
		b.Queue(recheckBatch[2])
		br := h.m.db.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			res, outcome, err = readLookup(br.QueryRow(), c.Token)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	return outcome, res, err
}

// readLookup reads lookupTxSQL's row.
func readLookup(row pgx.Row, token string) (idemserver.ClaimResult, claimOutcome, error) {
	var held, fp, record []byte
	switch err := row.Scan(&held, &fp, &record); {
	case errors.Is(err, pgx.ErrNoRows):
		return idemserver.ClaimResult{State: idemserver.Claimed}, claimRun, nil
	case err != nil:
		return idemserver.ClaimResult{}, 0, err
	case record != nil:
		return idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: string(fp), Record: record}, claimCompleted, nil
	case string(held) == token:
		// A claim row with our token: impossible, the token is new and
		// TxMiddleware writes no claim rows. Refuse rather than run.
		return idemserver.ClaimResult{}, 0, errors.New("claim row with this request's token")
	}
	return idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: string(fp)}, claimBusy, nil
}

// rollback ends the run without committing; it does nothing once the run
// has ended.
func (run *txRun) rollback(ctx context.Context) {
	if run.closed {
		return
	}
	run.closed = true
	run.lent.close()
	_ = run.tx.Rollback(ctx) // a failed rollback closes the connection, which rolls back
	if run.conn != nil {
		run.conn.Release()
	}
}

// commit stores record (unless c is nil) and commits. It returns
// errClaimLost, a *pgconn.PgError (the transaction was rolled back), or
// another error, after which the outcome is unknown.
//
// step is the test hook, called between the store and COMMIT where they
// are separate round trips.
func (run *txRun) commit(ctx context.Context, c *txClaim, record []byte, ttl time.Duration, step func(string)) error {
	if run.closed {
		return pgx.ErrTxClosed
	}
	run.lent.close()
	if c == nil {
		run.closed = true
		err := run.tx.Commit(ctx)
		if run.conn != nil {
			run.conn.Release()
		}
		return err
	}
	if run.conn == nil {
		var same bool
		if err := run.tx.QueryRow(ctx, sameTxSQL, run.began).Scan(&same); err != nil || !same {
			run.rollback(ctx)
			if err == nil {
				err = errTxEnded
			}
			return err
		}
		tag, err := run.tx.Exec(ctx, storeTxSQL, c.row, []byte(c.Token), []byte(c.fingerprint), record, ttl)
		switch {
		case err != nil:
			run.rollback(ctx)
			return err
		case tag.RowsAffected() != 1:
			run.rollback(ctx)
			return errClaimLost
		}
		step("store-sent")
		run.closed = true
		return run.tx.Commit(ctx)
	}
	// One round trip: the guarded store, then COMMIT. The pgx Tx is left
	// behind unclosed; the handler's view of it is closed, and the
	// connection goes back to the pool only if the session is idle.
	b := &pgx.Batch{}
	b.Queue(storeGuardSQL, c.row, []byte(c.Token), []byte(c.fingerprint), record, ttl, run.began)
	b.Queue("COMMIT")
	br := run.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil && tag.String() != "COMMIT":
		err = &pgconn.PgError{Severity: "ERROR", Code: "40000", Message: "COMMIT answered " + tag.String()}
	case errors.As(err, &pgErr) && pgErr.Code == divisionByZero:
		err = errClaimLost
	case errors.As(err, &pgErr) && pgErr.Code == numericOutOfRange:
		err = errTxEnded
	}
	if err != nil && run.conn.Conn().PgConn().TxStatus() != 'I' {
		// Still in the (aborted) transaction: end it, or the connection
		// is destroyed on release, which also ends it.
		_, _ = run.conn.Exec(ctx, "ROLLBACK")
	}
	run.closed = true
	run.conn.Release()
	return err
}

// handlerTx is the transaction as the handler sees it: the request's, but
// its Commit and Rollback refuse (TxMiddleware commits it with the stored
// response, or rolls it back), and once the handler has returned it is
// closed, so that a goroutine the handler left behind cannot write
// through a connection that went back to the pool. Begin makes a
// savepoint, as pgx's own nested transactions do.
type handlerTx struct {
	tx     pgx.Tx
	closed atomic.Bool
}

var _ pgx.Tx = (*handlerTx)(nil)

// errOwnedTx is returned by the handler's Commit and Rollback.
var errOwnedTx = errors.New("idemhttp/postgres: TxMiddleware commits or rolls back the transaction; return an error to roll back")

func (t *handlerTx) close() {
	if t != nil {
		t.closed.Store(true)
	}
}

func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.tx.Begin(ctx)
}

func (t *handlerTx) Commit(context.Context) error   { return errOwnedTx }
func (t *handlerTx) Rollback(context.Context) error { return errOwnedTx }

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return t.tx.SendBatch(ctx, b)
}

func (t *handlerTx) LargeObjects() pgx.LargeObjects { return t.tx.LargeObjects() }

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.tx.Prepare(ctx, name, sql)
}

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.tx.Exec(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.tx.Query(ctx, sql, args...)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{}
	}
	return t.tx.QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection, which pgx's helpers need
// (its type map, for one). What goes through it is the handler's
// responsibility; a COMMIT or ROLLBACK sent there is found all the same
// once the handler returns (see TxMiddleware), and the connection goes
// back to the pool only when the request ends.
func (t *handlerTx) Conn() *pgx.Conn { return t.tx.Conn() }

type errRow struct{}

func (errRow) Scan(...any) error { return pgx.ErrTxClosed }
