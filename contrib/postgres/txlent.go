package postgres

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// txTarget is what the handler's statements go through: the transaction
// pgx began (a DB that is not a pool, or a pool that takes no wire), or
// the connection the wire began it on. Both run on the transaction's
// connection.
type txTarget interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error)
}

var (
	_ txTarget = (pgx.Tx)(nil)
	_ txTarget = (*pgx.Conn)(nil)
)

// handlerTx is the transaction as the handler sees it: the request's, but
// its Commit and Rollback refuse (TxMiddleware commits it with the stored
// response, or rolls it back), and once the handler has returned it is
// closed, and so is every savepoint it made (Begin), so that a goroutine
// the handler left behind cannot write through a connection that went
// back to the pool. Begin makes a savepoint, as pgx's own nested
// transactions do.
type handlerTx struct {
	target txTarget
	conn   *pgx.Conn // the transaction's connection, for Conn
	// tx is the pgx transaction, on the pgx path; nil on the wire, where
	// lo is the one LargeObjects works through, made on first use (under
	// mu: a goroutine the handler left may call it as the run ends).
	tx         pgx.Tx
	mu         sync.Mutex
	lo         pgx.Tx
	timeout    time.Duration // bounds the making of lo
	savepoints int64
	closed     atomic.Bool
}

var _ pgx.Tx = (*handlerTx)(nil)

// errOwnedTx is returned by the handler's Commit and Rollback.
var errOwnedTx = errors.New("idemhttp/postgres: TxMiddleware commits or rolls back the transaction; return an error to roll back")

// errBatchBegins is returned by SendBatch for a batch that begins a
// transaction (pgx.Batch.BeginTx), as a pgx transaction's SendBatch
// refuses it.
var errBatchBegins = errors.New("Batch.BeginTx cannot be used within a transaction")

func (t *handlerTx) close() {
	if t != nil {
		t.closed.Store(true)
	}
}

func (t *handlerTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	t.savepoints++
	sp := &savepointTx{root: t, name: "sp_" + strconv.FormatInt(t.savepoints, 10)}
	if _, err := t.target.Exec(ctx, "savepoint "+sp.name); err != nil {
		return nil, err
	}
	return sp, nil
}

func (t *handlerTx) Commit(context.Context) error   { return errOwnedTx }
func (t *handlerTx) Rollback(context.Context) error { return errOwnedTx }

func (t *handlerTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.closed.Load() {
		return 0, pgx.ErrTxClosed
	}
	return t.target.CopyFrom(ctx, table, columns, src)
}

func (t *handlerTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.closed.Load() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	// A batch that begins a transaction is one whose results would have
	// one (documented of FailedBatchResults).
	if pgx.FailedBatchResults(b, errBatchBegins).Tx() != nil {
		return pgx.FailedBatchResults(b, errBatchBegins)
	}
	return t.target.SendBatch(ctx, b)
}

// LargeObjects returns the transaction's large objects. On the wire, the
// first call makes the pgx transaction they work through, in a round trip
// of an empty statement (pgx makes one only by sending its begin query),
// bounded by the middleware's DBTimeout; should that fail, or the handler
// have returned, every call on them fails.
func (t *handlerTx) LargeObjects() pgx.LargeObjects {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed.Load():
		return closedTx(pgx.ErrTxClosed).LargeObjects()
	case t.tx != nil:
		t.lo = t.tx // see endLargeObjects
	case t.lo == nil:
		ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
		defer cancel()
		lo, err := t.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: ";"})
		if err != nil {
			return closedTx(err).LargeObjects()
		}
		t.lo = lo
	}
	return t.lo.LargeObjects()
}

// endLargeObjects closes the pgx transaction the handler's LargeObjects
// work through, if it asked for them, so that they fail with
// pgx.ErrTxClosed from a goroutine the handler left once the connection
// is back in the pool: the wire's (made in LargeObjects), or pgx's own,
// which a pool's pipelined commit leaves open. pgx closes one only by
// sending ROLLBACK (none if it is closed already): the caller does this
// once the request's transaction has ended, where that ROLLBACK ends
// nothing (the server answers it with a warning).
func (t *handlerTx) endLargeObjects(d *dbStep) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lo != nil {
		_ = t.lo.Rollback(d.context())
	}
}

// closedTx returns a pgx transaction that is closed: every call on it,
// and on its large objects, fails with pgx.ErrTxClosed.
func closedTx(err error) pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	return pgx.FailedBatchResults(b, err).Tx()
}

func (t *handlerTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.target.Prepare(ctx, name, sql)
}

func (t *handlerTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.closed.Load() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.target.Exec(ctx, sql, args...)
}

func (t *handlerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.closed.Load() {
		return nil, pgx.ErrTxClosed
	}
	return t.target.Query(ctx, sql, args...)
}

func (t *handlerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.closed.Load() {
		return errRow{}
	}
	return t.target.QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection, which pgx's helpers need
// (its type map, for one). What goes through it is the handler's
// responsibility; a COMMIT or ROLLBACK sent there is found all the same
// once the handler returns (see TxMiddleware), and the connection goes
// back to the pool only when the request ends.
func (t *handlerTx) Conn() *pgx.Conn { return t.conn }

type errRow struct{}

func (errRow) Scan(...any) error { return pgx.ErrTxClosed }

// savepointTx is a savepoint the handler made with Begin: a nested
// transaction whose Commit releases it and whose Rollback rolls back to
// it, as pgx's are. It closes with the handler's transaction.
type savepointTx struct {
	root   *handlerTx
	name   string
	closed bool
}

var _ pgx.Tx = (*savepointTx)(nil)

func (sp *savepointTx) done() bool { return sp.closed || sp.root.closed.Load() }

func (sp *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if sp.done() {
		return nil, pgx.ErrTxClosed
	}
	return sp.root.Begin(ctx)
}

func (sp *savepointTx) Commit(ctx context.Context) error {
	if sp.done() {
		return pgx.ErrTxClosed
	}
	_, err := sp.root.Exec(ctx, "release savepoint "+sp.name)
	sp.closed = true
	return err
}

func (sp *savepointTx) Rollback(ctx context.Context) error {
	if sp.done() {
		return pgx.ErrTxClosed
	}
	_, err := sp.root.Exec(ctx, "rollback to savepoint "+sp.name)
	sp.closed = true
	return err
}

func (sp *savepointTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if sp.done() {
		return 0, pgx.ErrTxClosed
	}
	return sp.root.CopyFrom(ctx, table, columns, src)
}

func (sp *savepointTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if sp.done() {
		return pgx.FailedBatchResults(b, pgx.ErrTxClosed)
	}
	return sp.root.SendBatch(ctx, b)
}

func (sp *savepointTx) LargeObjects() pgx.LargeObjects {
	if sp.done() {
		return closedTx(pgx.ErrTxClosed).LargeObjects()
	}
	return sp.root.LargeObjects()
}

func (sp *savepointTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if sp.done() {
		return nil, pgx.ErrTxClosed
	}
	return sp.root.Prepare(ctx, name, sql)
}

func (sp *savepointTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if sp.done() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return sp.root.Exec(ctx, sql, args...)
}

func (sp *savepointTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if sp.done() {
		return nil, pgx.ErrTxClosed
	}
	return sp.root.Query(ctx, sql, args...)
}

func (sp *savepointTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if sp.done() {
		return errRow{}
	}
	return sp.root.QueryRow(ctx, sql, args...)
}

func (sp *savepointTx) Conn() *pgx.Conn { return sp.root.Conn() }
