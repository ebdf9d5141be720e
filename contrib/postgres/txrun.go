package postgres

import (
	"context"
	"errors"
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

// txRun is one request's open transaction. On a pool's connection that
// takes the wire (wireFor), the middleware's statements go through the
// wire and the handler's through the connection; otherwise pgx began the
// transaction (tx), and every statement goes through pgx.
type txRun struct {
	tx     pgx.Tx        // the pgx path's transaction; nil on the wire
	conn   *pgxpool.Conn // a pool's connection, released at the end
	w      *wireConn     // the wire, or nil
	pg     *pgconn.PgConn
	lent   handlerTx // the handler's view of the transaction
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

// dbStep bounds one of the middleware's own steps: a database that does
// not answer (a partition) gets the request 503 by the deadline, and the
// connection is closed (the wire closes it, and so does pgx when a
// statement's context ends), so requests nobody waits for do not fill the
// pool. The context pgx's calls take is made only when one runs: the wire
// takes the deadline as it is.
type dbStep struct {
	parent   context.Context // what else ends the step (the client, for a claim)
	deadline time.Time
	ctx      context.Context
	cancel   context.CancelFunc
}

func newDBStep(parent context.Context, timeout time.Duration) dbStep {
	return dbStep{parent: parent, deadline: time.Now().Add(timeout)}
}

// context returns the step's context for pgx's calls.
func (d *dbStep) context() context.Context {
	if d.ctx == nil {
		d.ctx, d.cancel = context.WithDeadline(d.parent, d.deadline)
	}
	return d.ctx
}

// done releases the step's context, if one was made.
func (d *dbStep) done() {
	if d.cancel != nil {
		d.cancel()
	}
}

// end rolls the run back and reports whether the handler had ended the
// claim's transaction itself: the connection outside any transaction, or
// in one begun later. A transaction found aborted is taken for the
// claim's: PostgreSQL answers no statement in it, so a handler that
// committed, began again and left the new transaction aborted is not told
// from one whose statement failed here; the look at the key after the
// rollback then finds its claim row, committed with its COMMIT, by the
// run's token, and the core keeps the key as for a handler that ended
// its transaction (servercore.Request.Rechecked). On a pool the check
// rides with the ROLLBACK, in its round trip.
func (run *txRun) end(d *dbStep, st *wireStmts) (ended bool) {
	if run.closed {
		return false
	}
	pg := run.pg
	switch {
	case pg == nil || pg.IsClosed():
		run.rollback(d, st)
		return false
	case pg.TxStatus() == 'I':
		run.rollback(d, st)
		return true
	case pg.TxStatus() == 'E' || run.began == 0: // aborted, or a run without a key
		run.rollback(d, st)
		return false
	}
	var same bool
	switch {
	case run.w != nil:
		run.closed = true
		run.lent.close()
		w := run.w
		w.start()
		at := w.bind(st.sameTx)
		w.int8(run.began)
		w.exec(at)
		w.exec(w.bind(st.rollback))
		err := w.run(d.parent, d.deadline)
		if err == nil {
			var r *wireResult
			if r, err = w.result(0); err == nil {
				same, err = w.boolValue(r)
			}
		}
		run.release(d, st)
		return err == nil && !same
	case run.conn == nil:
		err := run.tx.QueryRow(d.context(), sameTxSQL, run.began).Scan(&same)
		run.rollback(d, st)
		return err == nil && !same
	}
	run.closed = true
	run.lent.close()
	b := &pgx.Batch{}
	b.Queue(sameTxSQL, run.began)
	b.Queue("ROLLBACK")
	br := run.conn.SendBatch(d.context(), b)
	err := br.QueryRow().Scan(&same)
	_, _ = br.Exec()
	_ = br.Close()
	run.release(d, st)
	return err == nil && !same
}

// release gives a pool's connection back, after a ROLLBACK if it is still
// in a transaction (else the pool would destroy it, which ends it too).
func (run *txRun) release(d *dbStep, st *wireStmts) {
	if run.conn == nil {
		return
	}
	if pg := run.pg; !pg.IsClosed() && pg.TxStatus() != 'I' {
		if run.w != nil {
			run.w.start()
			run.w.exec(run.w.bind(st.rollback))
			_ = run.w.run(d.parent, d.deadline) // a failure closes the connection
		} else {
			_, _ = run.conn.Exec(d.context(), "ROLLBACK")
		}
	}
	run.lent.endLargeObjects(d)
	if run.w != nil {
		run.w.trim() // the flights' answers are decoded
	}
	run.conn.Release()
	run.conn = nil
}

type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// claim opens the request's transaction and, for a keyed request, claims
// the key in it, in one round trip, and returns the open run when it took
// the key (nil otherwise) and what the claim found, for the core to
// decide on. A connection found dead before anything ran is replaced and
// the whole step retried: nothing is committed before the end.
func (h *txHandler) claim(d *dbStep, c *txClaim) (*txRun, servercore.Found, error) {
	var (
		run   *txRun
		found servercore.Found
	)
	ctx := d.context()
	err := retry(ctx, func() (err error) {
		run, found, err = h.claimOnce(d, c)
		return err
	})
	if err == nil && run == nil && c != nil && found.State == servercore.Free {
		// A look at the key (after a serialization failure) found it
		// free, but nothing claimed it: nothing is known.
		err = errors.New("the key is free, but the claim did not take it")
	}
	return run, found, err
}

func (h *txHandler) claimOnce(d *dbStep, c *txClaim) (*txRun, servercore.Found, error) {
	m := h.m
	ctx := d.context()
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
	// On a pool, hold the connection itself, so that commit can pipeline
	// the response and COMMIT and then release it.
	var (
		run    *txRun
		found  servercore.Found
		locked bool
		err    error
	)
	var held *pgxpool.Conn // the connection, while a panic would strand it
	// The run, while a panic would strand it: on a DB that is no pool
	// (it began the transaction through SendBatch and holds its
	// connection), there is no held connection to close, and the open
	// transaction kept the connection and the key's lock for ever.
	var stranded *txRun
	defer func() {
		if held == nil && stranded != nil {
			stranded.rollback(d, m.wire) // a failed rollback closes the connection
			return
		}
		if held != nil {
			// A panic in the middleware's own code while it holds the
			// connection (a bug: a decoder's, say): close it rather than
			// return it to the pool in a state nobody knows, or leave it
			// acquired for ever (the pool drained one connection a retry,
			// pool.Close hung). Closing the session ends its transaction
			// and frees the key's lock; the panic goes on.
			_ = held.Conn().Close(context.WithoutCancel(ctx))
			held.Release()
		}
	}()
	if p, ok := m.db.(acquirer); ok {
		conn, aerr := p.Acquire(ctx)
		if aerr != nil {
			return nil, servercore.Found{}, aerr
		}
		held = conn
		if w := wireFor(conn.Conn()); w != nil && m.wire != nil {
			run, found, locked, err = h.beginWire(d, c, conn, w)
		} else {
			run, found, locked, err = h.beginBatch(ctx, c, conn)
		}
		if run == nil {
			held = nil // released by the begin that failed
		}
	} else {
		run, found, locked, err = h.beginBatch(ctx, c, nil)
	}
	stranded = run
	h.step("claimed")
	if err == nil && c != nil && found.State == 0 && !m.lookupApart {
		// Not claimed: read the key's row in the same transaction, and
		// roll back in the same round trip. (Only then: a claim that took
		// the key reads nothing more.)
		found, err = run.lookupAndEnd(d, m, c, locked)
	}
	if err != nil || (c != nil && found.State != servercore.Free) {
		if run != nil {
			run.rollback(d, m.wire) // ErrTxClosed if the begin failed
		}
		held, stranded = nil, nil // given back
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
	held, stranded = nil, nil // the run's now
	run.lent.timeout = m.dbTimeout
	return run, servercore.Found{State: servercore.Free}, nil
}

// beginWire begins the transaction on conn through the wire and, for a
// keyed request, claims the key, in one round trip: claimOnce's step
// there. It returns the run (nil if the transaction did not begin) and
// what the claim found: whether it took the key's lock and wrote the
// claim row (Free), or a zero State: not claimed, the key's row yet to be
// read.
func (h *txHandler) beginWire(d *dbStep, c *txClaim, conn *pgxpool.Conn, w *wireConn) (*txRun, servercore.Found, bool, error) {
	m, st := h.m, h.m.wire
	w.start()
	w.exec(w.bind(st.begin))
	if m.idleTimeout != "" {
		at := w.bind(st.setIdle)
		w.text(m.idleTimeout)
		w.exec(at)
	}
	if c != nil {
		at := w.bind(st.claim)
		w.int8(c.lock)
		w.bytes(c.row)
		w.text(c.Token)
		w.text(c.fingerprint)
		w.interval(m.ttl)
		w.exec(at)
	}
	if err := w.run(d.parent, d.deadline); err != nil {
		conn.Release() // destroyed: the wire closed it
		return nil, servercore.Found{}, false, err
	}
	run := &txRun{conn: conn, w: w, pg: w.pg}
	run.lent.target, run.lent.conn = conn.Conn(), conn.Conn()
	if err := w.firstErr(); err != nil {
		return run, servercore.Found{}, false, err
	}
	if c == nil {
		return run, servercore.Found{State: servercore.Free}, false, nil
	}
	r, _ := w.result(len(w.res) - 1)
	locked, began, ctid, err := w.claimRow(r)
	if err != nil {
		return run, servercore.Found{}, false, err
	}
	run.began, run.row = began, ctid
	if !ctid.Valid {
		return run, servercore.Found{}, locked, nil
	}
	found, err := servercore.TxFound(locked, true, servercore.Row{})
	return run, found, locked, err
}

// claimRow decodes the claim statement's row: whether it took the lock,
// the transaction's start and the claim row's ctid (not Valid if it wrote
// none).
func (w *wireConn) claimRow(r *wireResult) (locked bool, began int64, ctid pgtype.TID, err error) {
	var v [3][]byte
	for j := range v {
		var ok bool
		if v[j], ok = w.value(r, j, len(v)); !ok {
			return false, 0, ctid, errBadValue
		}
	}
	if locked, err = decodeBool(v[0]); err != nil {
		return false, 0, ctid, err
	}
	if began, err = decodeInt8(v[1]); err != nil {
		return false, 0, ctid, err
	}
	if v[2] != nil {
		ctid, err = decodeTID(v[2])
	}
	return locked, began, ctid, err
}

// boolValue decodes a statement's one boolean column.
func (w *wireConn) boolValue(r *wireResult) (bool, error) {
	v, ok := w.value(r, 0, 1)
	if !ok || v == nil {
		return false, errBadValue
	}
	return decodeBool(v)
}

// beginBatch is beginWire through pgx: a pgx.Batch that begins the
// transaction (on conn when not nil, else on the DB).
func (h *txHandler) beginBatch(ctx context.Context, c *txClaim, conn *pgxpool.Conn) (*txRun, servercore.Found, bool, error) {
	m := h.m
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{IsoLevel: m.isoLevel})
	if m.idleTimeout != "" {
		b.Queue(setIdleTimeoutSQL, m.idleTimeout)
	}
	if c != nil {
		b.Queue(m.sql.claim, c.lock, c.row, c.token(), c.fpBytes(), m.ttl)
	}
	var br pgx.BatchResults
	if conn != nil {
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
	if tx == nil {
		if conn != nil {
			conn.Release()
		}
		return nil, found, locked, err
	}
	run := &txRun{tx: tx, conn: conn, pg: tx.Conn().PgConn(), began: began, row: row}
	run.lent.target, run.lent.conn, run.lent.tx = tx, tx.Conn(), tx
	return run, found, locked, err
}

// readClaim reads the results of beginBatch's batch: whether the claim
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

// lookupAndEnd reads the key's live row in the run, a claim's transaction
// that did not take the key, and rolls it back, in one round trip on a
// pool's connection (two otherwise); then it says what the claim found.
// Under READ COMMITTED the read's snapshot follows the lock's try, so a
// run that committed before the lock was free is seen.
func (run *txRun) lookupAndEnd(d *dbStep, m *TxMiddleware, c *txClaim, locked bool) (servercore.Found, error) {
	var (
		row servercore.Row
		err error
	)
	run.closed = true
	run.lent.close()
	switch {
	case run.w != nil:
		w := run.w
		w.start()
		at := w.bind(m.wire.lookup)
		w.bytes(c.row)
		w.exec(at)
		w.exec(w.bind(m.wire.rollback))
		if err = w.run(d.parent, d.deadline); err == nil {
			var r *wireResult
			if r, err = w.result(0); err == nil {
				row, err = w.lookupRow(r)
			}
		}
		run.release(d, m.wire)
	case run.conn == nil:
		row, err = readRow(run.tx.QueryRow(d.context(), m.sql.lookup, c.row))
		_ = run.tx.Rollback(d.context())
	default:
		b := &pgx.Batch{}
		b.Queue(m.sql.lookup, c.row)
		b.Queue("ROLLBACK")
		br := run.conn.SendBatch(d.context(), b)
		row, err = readRow(br.QueryRow())
		_, _ = br.Exec()
		_ = br.Close()
		run.release(d, m.wire)
	}
	if err != nil {
		return servercore.Found{}, err
	}
	return servercore.TxFound(locked, false, row)
}

// lookupRow decodes the lookup statement's row, if any.
func (w *wireConn) lookupRow(r *wireResult) (servercore.Row, error) {
	if r.nvals == 0 {
		return servercore.Row{}, nil
	}
	var v [3][]byte
	for j := range v {
		var ok bool
		if v[j], ok = w.value(r, j, len(v)); !ok {
			return servercore.Row{}, errBadValue
		}
	}
	if v[0] == nil || v[1] == nil {
		return servercore.Row{}, errBadValue // NOT NULL columns
	}
	row := servercore.Row{Exists: true, Completed: v[2] != nil, Token: string(v[0]), Fingerprint: string(v[1])}
	if v[2] != nil {
		row.Record = append([]byte(nil), v[2]...)
	}
	return row, nil
}

// readRow reads the lookup statement's row. The token tells the core
// whether the row is the request's own claim row (see
// servercore.Request.Rechecked).
func readRow(row pgx.Row) (servercore.Row, error) {
	var token, fp, record []byte
	switch err := row.Scan(&token, &fp, &record); {
	case errors.Is(err, pgx.ErrNoRows):
		return servercore.Row{}, nil
	case err != nil:
		return servercore.Row{}, err
	}
	return servercore.Row{Exists: true, Completed: record != nil, Token: string(token), Fingerprint: string(fp), Record: record}, nil
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
func (run *txRun) rollback(d *dbStep, st *wireStmts) {
	if run.closed {
		return
	}
	run.closed = true
	run.lent.close()
	if run.tx != nil {
		_ = run.tx.Rollback(d.context()) // a failed rollback closes the connection, which rolls back
	}
	run.release(d, st)
}

// commit stores record in the claim row (unless c is nil) and commits,
// and says how that went, with the error for the log.
//
// step is the test hook, called between the store and COMMIT where they
// are separate round trips.
func (run *txRun) commit(d *dbStep, m *TxMiddleware, c *txClaim, record []byte, step func(string)) (servercore.Commit, error) {
	if run.closed {
		return servercore.CommitUnknown, pgx.ErrTxClosed
	}
	run.lent.close()
	switch {
	case run.w != nil:
		return run.commitWire(d, m.wire, c, record)
	case c == nil:
		run.closed = true
		err := run.tx.Commit(d.context())
		if run.conn != nil {
			run.conn.Release()
		}
		return commitOutcome(err)
	case run.conn == nil:
		ctx := d.context()
		var same bool
		if err := run.tx.QueryRow(ctx, sameTxSQL, run.began).Scan(&same); err != nil || !same {
			run.rollback(d, m.wire)
			if err == nil {
				return servercore.CommitEnded, errTxEnded
			}
			return commitOutcome(err)
		}
		tag, err := run.tx.Exec(ctx, m.sql.store, c.row, c.token(), record, run.row)
		switch {
		case err != nil:
			run.rollback(d, m.wire)
			return commitOutcome(err)
		case tag.RowsAffected() != 1:
			run.rollback(d, m.wire)
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
	b.Queue(m.sql.storeGuard, c.row, c.token(), record, run.row, run.began)
	b.Queue("COMMIT")
	br := run.conn.SendBatch(d.context(), b)
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
	run.closed = true
	run.release(d, m.wire)
	return commitOutcome(err)
}

// commitWire is commit on the wire: the guarded store (for a keyed run)
// and COMMIT in one round trip.
func (run *txRun) commitWire(d *dbStep, st *wireStmts, c *txClaim, record []byte) (servercore.Commit, error) {
	w := run.w
	w.start()
	if c != nil {
		at := w.bind(st.storeGuard)
		w.bytes(c.row)
		w.text(c.Token)
		w.bytes(record)
		w.tid(run.row)
		w.int8(run.began)
		w.exec(at)
	}
	w.exec(w.bind(st.commit))
	run.closed = true
	err := w.run(d.parent, d.deadline)
	if err == nil {
		err = w.firstErr()
	}
	if err == nil {
		if r := &w.res[len(w.res)-1]; !r.tagIs("COMMIT") {
			err = &pgconn.PgError{Severity: "ERROR", Code: "40000", Message: "COMMIT answered " + string(r.tag[:r.ntag])}
		}
	}
	run.release(d, st)
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
