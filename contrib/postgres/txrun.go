package postgres

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp/internal/servercore"
)

// errTxEnded: the transaction is not the claim's any more.
var errTxEnded = errors.New("the handler ended the transaction")

// errClaimLost: the claim's row was not there to store the response in.
var errClaimLost = errors.New("claim lost")

// txRun is one request's open transaction.
type txRun struct {
	tx     pgx.Tx
	conn   *pgxpool.Conn // the pipelined path's connection, released at the end
	pg     *pgconn.PgConn
	lent   *handlerTx // the handler's view of tx
	closed bool
	began  int64      // the transaction's start (txStartSQL), for a keyed run; 0 without a key
	row    pgtype.TID // the claim row, for a keyed run
}

// state is the transaction as the handler left it, read from the
// connection without a round trip.
func (run *txRun) state() servercore.TxState {
	pg := run.pg
	switch {
	case pg == nil || pg.IsClosed():
		return servercore.TxBroken
	case pg.TxStatus() == 'I':
		return servercore.TxIdle
	case pg.TxStatus() == 'E':
		return servercore.TxAborted
	}
	return servercore.TxOpen
}

// end rolls the run back and reports whether the handler had ended the
// claim's transaction itself: the connection outside any transaction, or
// in one begun later. A transaction found aborted is taken for the
// claim's: PostgreSQL answers no statement in it, so a handler that
// committed, began again and left the new transaction aborted is not told
// from one whose statement failed (its claim row, committed with its
// COMMIT, still holds the key for the TTL). On a pool the check rides
// with the ROLLBACK, in its round trip.
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

type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// claim opens the request's transaction and, for a keyed request, claims
// the key in it, in one round trip, and returns the open run when it took
// the key (nil otherwise) and what the claim found, for the core to
// decide on. A connection found dead before anything ran is replaced and
// the whole step retried: nothing is committed before the end.
func (h *txHandler) claim(ctx context.Context, c *txClaim) (*txRun, servercore.Found, error) {
	var (
		run   *txRun
		found servercore.Found
	)
	err := retry(ctx, func() (err error) {
		run, found, err = h.claimOnce(ctx, c)
		return err
	})
	if run != nil {
		run.lent = &handlerTx{tx: run.tx}
	} else if err == nil && c != nil && found.State == servercore.Free {
		// A look at the key (after a serialization failure) found it
		// free, but nothing claimed it: nothing is known.
		err = errors.New("the key is free, but the claim did not take it")
	}
	return run, found, err
}

func (h *txHandler) claimOnce(ctx context.Context, c *txClaim) (*txRun, servercore.Found, error) {
	m := h.m
	if c != nil && m.lookupApart {
		// Under SERIALIZABLE, a read of the key table in the request's
		// transaction takes predicate locks on its index pages, which the
		// other requests' records then write into: two requests with
		// different keys were taken to conflict, and most of a busy
		// server's requests failed with serialization errors (83% of 1600,
		// 16 at a time). So the key is looked up first, at READ
		// COMMITTED, in a round trip of its own. A run that commits
		// between that lookup and the claim makes the claim find its row:
		// then the key is looked up again, after the rollback.
		if found, err := h.recheck(ctx, c); err != nil || found.State != servercore.Free {
			return nil, found, err
		}
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: m.isoLevel})
	if m.idleTimeout != "" {
		b.Queue(setIdleTimeoutSQL, m.idleTimeout)
	}
	if c != nil {
		b.Queue(m.sql.claim, c.lock, c.row, c.token(), c.fp, m.ttl)
	}
	// On a pool, hold the connection itself, so that commit can pipeline
	// the response and COMMIT and then release it.
	var (
		conn *pgxpool.Conn
		br   pgx.BatchResults
	)
	if p, ok := m.db.(acquirer); ok {
		var err error
		if conn, err = p.Acquire(ctx); err != nil {
			return nil, servercore.Found{}, err
		}
		br = conn.SendBatch(ctx, b)
	} else {
		br = m.db.SendBatch(ctx, b)
	}
	tx := br.Tx()
	var (
		began  int64
		row    pgtype.TID
		locked bool
	)
	found, err := h.readClaim(br, c, &began, &row, &locked)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil && tx == nil {
		err = errors.New("the DB's SendBatch does not begin transactions (pgx.Batch.BeginTx)")
	}
	if err == nil && c != nil && found.State == 0 && !m.lookupApart {
		// Not claimed: read the key's row in the same transaction, and
		// roll back in the same round trip. (Only then: a claim that took
		// the key reads nothing more.)
		found, err = h.lookupAndEnd(ctx, tx, conn, c, locked)
		tx, conn = nil, nil
	}
	if err != nil || (c != nil && found.State != servercore.Free) {
		if tx != nil {
			_ = tx.Rollback(ctx) // ErrTxClosed if the begin failed
		}
		if conn != nil {
			conn.Release() // destroyed unless idle
		}
		switch {
		case c != nil && serializationFailure(err):
			// Under REPEATABLE READ and SERIALIZABLE the statement's
			// snapshot is taken before the key's lock, so a row another
			// writer (a Store sharing the table) committed while the claim
			// waited for it is not in the snapshot, and the claim fails.
			// The row is there to be found afresh.
			found, err = h.recheck(ctx, c)
		case err == nil && m.lookupApart && found.State == 0:
			// Not claimed: the lock was busy, or a live row was in the
			// way of the claim, committed since the lookup before. Read
			// it, at READ COMMITTED.
			var row servercore.Row
			if row, err = h.lookupRow(ctx, c); err == nil {
				found, err = servercore.TxFound(locked, false, row)
			}
		}
		return nil, found, err
	}
	return &txRun{tx: tx, conn: conn, pg: tx.Conn().PgConn(), began: began, row: row}, servercore.Found{State: servercore.Free}, nil
}

// readClaim reads the results of claimOnce's batch: whether the claim
// took the key's lock (into locked) and wrote the claim row (Free), the
// transaction's start into began and the claim row's ctid into ctid. A
// zero State means: not claimed, and the key's row is yet to be read.
func (h *txHandler) readClaim(br pgx.BatchResults, c *txClaim, began *int64, ctid *pgtype.TID, locked *bool) (servercore.Found, error) {
	if _, err := br.Exec(); err != nil { // BEGIN
		return servercore.Found{}, err
	}
	if h.m.idleTimeout != "" {
		if _, err := br.Exec(); err != nil {
			return servercore.Found{}, err
		}
	}
	if c == nil {
		return servercore.Found{State: servercore.Free}, nil
	}
	if err := br.QueryRow().Scan(locked, began, ctid); err != nil {
		return servercore.Found{}, err
	}
	if ctid.Valid {
		return servercore.TxFound(*locked, true, servercore.Row{})
	}
	return servercore.Found{}, nil
}

// lookupAndEnd reads the key's live row in tx, a claim's transaction that
// did not take the key, and rolls it back, in one round trip on a pool's
// connection (two otherwise); then it says what the claim found. Under
// READ COMMITTED the read's snapshot follows the lock's try, so a run
// that committed before the lock was free is seen.
func (h *txHandler) lookupAndEnd(ctx context.Context, tx pgx.Tx, conn *pgxpool.Conn, c *txClaim, locked bool) (servercore.Found, error) {
	var (
		row servercore.Row
		err error
	)
	if conn == nil {
		row, err = readRow(tx.QueryRow(ctx, h.m.sql.lookup, c.row))
		_ = tx.Rollback(ctx)
	} else {
		b := &pgx.Batch{}
		b.Queue(h.m.sql.lookup, c.row)
		b.Queue("ROLLBACK")
		br := conn.SendBatch(ctx, b)
		row, err = readRow(br.QueryRow())
		_, _ = br.Exec()
		_ = br.Close()
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(ctx, "ROLLBACK") // or the connection is destroyed on release, which ends it too
		}
		conn.Release()
	}
	if err != nil {
		return servercore.Found{}, err
	}
	return servercore.TxFound(locked, false, row)
}

// readRow reads the lookup statement's row.
func readRow(row pgx.Row) (servercore.Row, error) {
	var held, fp, record []byte
	switch err := row.Scan(&held, &fp, &record); {
	case errors.Is(err, pgx.ErrNoRows):
		return servercore.Row{}, nil
	case err != nil:
		return servercore.Row{}, err
	}
	return servercore.Row{Exists: true, Completed: record != nil, Fingerprint: string(fp), Record: record}, nil
}

// recheck looks the key up afresh, in a transaction of its own at READ
// COMMITTED whatever the server's default, so that it sees every row
// committed by the time it runs: what a new claim of it would find,
// short of taking it.
func (h *txHandler) recheck(ctx context.Context, c *txClaim) (servercore.Found, error) {
	row, err := h.lookupRow(ctx, c)
	if err != nil {
		return servercore.Found{}, err
	}
	return servercore.RowFound(row), nil
}

// lookupRow reads the key's live row at READ COMMITTED.
func (h *txHandler) lookupRow(ctx context.Context, c *txClaim) (servercore.Row, error) {
	var row servercore.Row
	err := retry(ctx, func() error {
		b := &pgx.Batch{}
		b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY")
		b.Queue(h.m.sql.lookup, c.row)
		b.Queue("COMMIT")
		br := h.m.db.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			row, err = readRow(br.QueryRow())
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	return row, err
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

// commit stores record in the claim row (unless c is nil) and commits,
// and says how that went, with the error for the log.
//
// step is the test hook, called between the store and COMMIT where they
// are separate round trips.
func (run *txRun) commit(ctx context.Context, sql *keysSQL, c *txClaim, record []byte, step func(string)) (servercore.Commit, error) {
	if run.closed {
		return servercore.CommitUnknown, pgx.ErrTxClosed
	}
	run.lent.close()
	if c == nil {
		run.closed = true
		err := run.tx.Commit(ctx)
		if run.conn != nil {
			run.conn.Release()
		}
		return commitOutcome(err)
	}
	if run.conn == nil {
		var same bool
		if err := run.tx.QueryRow(ctx, sameTxSQL, run.began).Scan(&same); err != nil || !same {
			run.rollback(ctx)
			if err == nil {
				return servercore.CommitEnded, errTxEnded
			}
			return commitOutcome(err)
		}
		tag, err := run.tx.Exec(ctx, sql.store, c.row, c.token(), record, run.row)
		switch {
		case err != nil:
			run.rollback(ctx)
			return commitOutcome(err)
		case tag.RowsAffected() != 1:
			run.rollback(ctx)
			return servercore.CommitClaimLost, errClaimLost
		}
		step("store-sent")
		run.closed = true
		return commitOutcome(run.tx.Commit(ctx))
	}
	// One round trip: the guarded store, then COMMIT. The pgx Tx is left
	// behind unclosed; the handler's view of it is closed, and the
	// connection goes back to the pool only if the session is idle.
	b := &pgx.Batch{}
	b.Queue(sql.storeGuard, c.row, c.token(), record, run.row, run.began)
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
	if err == nil && tag.String() != "COMMIT" {
		err = &pgconn.PgError{Severity: "ERROR", Code: "40000", Message: "COMMIT answered " + tag.String()}
	}
	if err != nil && run.conn.Conn().PgConn().TxStatus() != 'I' {
		// Still in the (aborted) transaction: end it, or the connection
		// is destroyed on release, which also ends it.
		_, _ = run.conn.Exec(ctx, "ROLLBACK")
	}
	run.closed = true
	run.conn.Release()
	return commitOutcome(err)
}

// commitOutcome says what a commit's error shows.
func commitOutcome(err error) (servercore.Commit, error) {
	if err == nil {
		return servercore.CommitOK, nil
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == divisionByZero:
		return servercore.CommitClaimLost, errClaimLost
	case errors.As(err, &pgErr) && pgErr.Code == numericOutOfRange:
		return servercore.CommitEnded, errTxEnded
	case serializationFailure(err):
		return servercore.CommitSerialization, err
	case errors.As(err, &pgErr):
		// The server answered, and refused: the transaction rolled back.
		return servercore.CommitRefused, err
	}
	return servercore.CommitUnknown, err
}

// serializationFailure reports whether err is PostgreSQL's
// serialization_failure (40001) or deadlock_detected (40P01): the
// transaction rolled back because of others running at the same time, and
// running it again may succeed.
func serializationFailure(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
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

// dbDeadline bounds one of the middleware's own steps: a database that
// does not answer (a partition) gets the request 503 within timeout,
// and the connection is closed (pgx closes a connection whose context
// ends mid-statement), so requests nobody waits for do not fill the pool.
func dbDeadline(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, timeout)
}
