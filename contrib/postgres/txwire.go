package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// The wire: TxMiddleware's own statements on a pool's connection, sent as
// PostgreSQL's extended protocol messages written into a buffer the
// connection keeps, and read back message by message, all of a step's
// statements in one flight ending with one Sync (one round trip), as
// pgx.Batch sends them, without its bookkeeping: pgx.Batch spent about 35
// allocations a step on queues and per-statement state (a third of a keyed
// request's), and a watch of the context per step.
//
// What pgx would do for the connection is kept: the statements are
// prepared once per connection, by name, when the pool's
// DefaultQueryExecMode caches statements (the default); in the other modes
// (a pooler in transaction mode that does not keep named statements) each
// is parsed unnamed in its flight. A pool configured for the simple
// protocol, or with a Tracer (which would not see these statements), takes
// the pgx.Batch path instead (wireFor).
//
// The parameter and result types are fixed by the statements (their
// OIDs are given when they are parsed) and sent and read in binary, so no
// statement is described; the decoders of the few result types are below.
//
// Deadlines: the step's bound is the connection's deadline (what pgx's
// default context watcher sets when a context ends), and a cancellable
// context sets it to now when it ends. A step that fails on the
// connection (a write, a read, a timeout, a message out of place) closes
// it: what the server ran of the flight is unknown, and its answers may
// still be on the way. The pool then destroys the connection.

// wireKey names a connection's wire state in its CustomData.
const wireKey = "github.com/idemkit/idemhttp/contrib/postgres.wire"

// maxKeptBuffer is the largest write buffer a connection keeps between
// steps: a large response's flight is written from a buffer of its own.
const maxKeptBuffer = 64 << 10

// The parameter types of the statements.
const (
	oidBool     = 16
	oidBytea    = 17
	oidInt8     = 20
	oidText     = 25
	oidTID      = 27
	oidInterval = 1186
)

// wireStmt is one statement as the wire sends it.
type wireStmt struct {
	sql  string
	name string   // its prepared statement's name: "idemhttp_" and a hash of sql
	oids []uint32 // its parameters' types
}

func newWireStmt(sql string, oids ...uint32) *wireStmt {
	sum := sha256.Sum256([]byte(sql))
	// 9 + 48 characters: within NAMEDATALEN (64), which PostgreSQL
	// truncates statement names to.
	return &wireStmt{sql: sql, name: "idemhttp_" + hex.EncodeToString(sum[:24]), oids: oids}
}

// wireStmts are the statements of one middleware.
type wireStmts struct {
	begin, setIdle, claim, lookup, storeGuard, sameTx, commit, rollback *wireStmt
}

// newWireStmts returns the statements of a middleware on sql's table, or
// nil (every statement through pgx) should one hold a NUL byte, which
// would end it early in the Parse message and put the rest of the message
// out of step with the server. The table's name, quoted by the server
// (findTable), holds none; this keeps it so whatever the name.
func newWireStmts(sql *keysSQL, begin string) *wireStmts {
	for _, q := range [...]string{begin, sql.claim, sql.lookup, sql.storeGuard} {
		if strings.IndexByte(q, 0) >= 0 {
			return nil
		}
	}
	return &wireStmts{
		begin:      newWireStmt(begin),
		setIdle:    newWireStmt(setIdleTimeoutSQL, oidText),
		claim:      newWireStmt(sql.claim, oidInt8, oidBytea, oidBytea, oidBytea, oidInterval),
		lookup:     newWireStmt(sql.lookup, oidBytea),
		storeGuard: newWireStmt(sql.storeGuard, oidBytea, oidBytea, oidBytea, oidTID, oidInt8),
		sameTx:     newWireStmt(sameTxSQL, oidInt8),
		commit:     newWireStmt("COMMIT"),
		rollback:   newWireStmt("ROLLBACK"),
	}
}

// txBeginSQL is the statement that begins a transaction at iso, as pgx
// writes it.
func txBeginSQL(iso pgx.TxIsoLevel) string {
	if iso == "" {
		return "BEGIN"
	}
	return "BEGIN ISOLATION LEVEL " + string(iso)
}

// wireConn is a connection's wire state, kept in its CustomData. Only the
// goroutine that holds the connection uses it.
type wireConn struct {
	pg       *pgconn.PgConn
	named    bool                // statements are prepared by name and kept
	prepared map[string]struct{} // the names prepared on the connection

	buf     []byte
	parsing []string // the names whose Parse is in the flight
	stale   error    // a statement of the flight found prepared statements out of step (see staleStatement)
	res     []wireResult
	vals    []byte // the first rows' values, copied (res refers into it)
}

// wireResult is what one statement of a flight answered.
type wireResult struct {
	done bool // its CommandComplete came
	tag  [16]byte
	ntag int
	// The values of its first row: offsets into wireConn.vals, a
	// negative length for NULL.
	off, n [4]int
	nvals  int
	err    error // the server's error, which skips the rest of the flight
}

// wireFor returns the wire state of conn, or nil when its statements go
// through pgx: a connection configured for the simple protocol, or with a
// tracer.
func wireFor(conn *pgx.Conn) *wireConn {
	pg := conn.PgConn()
	data := pg.CustomData()
	if w, ok := data[wireKey].(*wireConn); ok {
		return w
	}
	var w *wireConn
	cfg := conn.Config()
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeSimpleProtocol && cfg.Tracer == nil {
		w = &wireConn{pg: pg, named: cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement, prepared: map[string]struct{}{}}
	}
	data[wireKey] = w // a nil *wireConn remembers the answer
	return w
}

// start begins a flight.
func (w *wireConn) start() {
	w.stale = nil
	w.buf = w.buf[:0]
	w.parsing = w.parsing[:0]
	w.res = w.res[:0]
	w.vals = w.vals[:0]
}

// bind queues statement s, parsed first unless it is prepared on the
// connection; its parameters follow (int8, bytea, text, tid, interval),
// then exec. It returns where its Bind message starts.
func (w *wireConn) bind(s *wireStmt) int {
	name := ""
	if w.named {
		name = s.name
	}
	if _, ok := w.prepared[name]; !ok || !w.named {
		at := w.begin('P')
		w.buf = append(w.buf, name...)
		w.buf = append(w.buf, 0)
		w.buf = append(w.buf, s.sql...)
		w.buf = append(w.buf, 0)
		w.buf = binary.BigEndian.AppendUint16(w.buf, uint16(len(s.oids)))
		for _, oid := range s.oids {
			w.buf = binary.BigEndian.AppendUint32(w.buf, oid)
		}
		w.end(at)
		if w.named {
			w.parsing = append(w.parsing, name)
		}
	}
	at := w.begin('B')
	w.buf = append(w.buf, 0) // the unnamed portal
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, 0)
	// Every parameter in binary.
	w.buf = binary.BigEndian.AppendUint16(w.buf, 1)
	w.buf = binary.BigEndian.AppendUint16(w.buf, 1)
	w.buf = binary.BigEndian.AppendUint16(w.buf, uint16(len(s.oids)))
	w.res = append(w.res, wireResult{})
	return at
}

func (w *wireConn) int8(v int64) {
	w.buf = binary.BigEndian.AppendUint32(w.buf, 8)
	w.buf = binary.BigEndian.AppendUint64(w.buf, uint64(v))
}

func (w *wireConn) bytes(b []byte) {
	w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(len(b)))
	w.buf = append(w.buf, b...)
}

// text is a text or bytea parameter given as a string.
func (w *wireConn) text(s string) {
	w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(len(s)))
	w.buf = append(w.buf, s...)
}

func (w *wireConn) tid(t pgtype.TID) {
	w.buf = binary.BigEndian.AppendUint32(w.buf, 6)
	w.buf = binary.BigEndian.AppendUint32(w.buf, t.BlockNumber)
	w.buf = binary.BigEndian.AppendUint16(w.buf, t.OffsetNumber)
}

// interval is d as pgx sends a time.Duration: microseconds, no days or
// months.
func (w *wireConn) interval(d time.Duration) {
	w.buf = binary.BigEndian.AppendUint32(w.buf, 16)
	w.buf = binary.BigEndian.AppendUint64(w.buf, uint64(d.Microseconds()))
	w.buf = binary.BigEndian.AppendUint64(w.buf, 0)
}

// exec ends the Bind begun at at and executes it, every result column in
// binary.
func (w *wireConn) exec(at int) {
	w.buf = binary.BigEndian.AppendUint16(w.buf, 1)
	w.buf = binary.BigEndian.AppendUint16(w.buf, 1)
	w.end(at)
	w.buf = append(w.buf, 'E', 0, 0, 0, 9, 0, 0, 0, 0, 0)
}

// begin appends a message's type and room for its length.
func (w *wireConn) begin(typ byte) int {
	at := len(w.buf)
	w.buf = append(w.buf, typ, 0, 0, 0, 0)
	return at
}

// end writes the length of the message begun at at.
func (w *wireConn) end(at int) {
	binary.BigEndian.PutUint32(w.buf[at+1:], uint32(len(w.buf)-at-1))
}

// errWireTooLarge: a message would exceed the protocol's limit.
var errWireTooLarge = errors.New("statement too large for the wire")

// wireError is a failure of the connection during a step. Before any byte
// of the flight was written it is safe to retry (retriable), like pgx's.
type wireError struct {
	err         error
	safeToRetry bool
}

func (e *wireError) Error() string     { return "idemhttp/postgres: " + e.err.Error() }
func (e *wireError) Unwrap() error     { return e.err }
func (e *wireError) SafeToRetry() bool { return e.safeToRetry }

// run sends the flight and reads every answer up to the server's
// ReadyForQuery, by deadline; cancel, when it can end, ends the step at
// once. It returns an error of the connection (which it closes then);
// the statements' own errors are in w.res.
func (w *wireConn) run(cancel context.Context, deadline time.Time) error {
	defer w.trimBuf() // the values are still to be decoded: see trim
	pg := w.pg
	if pg.IsClosed() || pg.IsBusy() {
		return &wireError{err: errors.New("connection closed or busy"), safeToRetry: true}
	}
	w.buf = append(w.buf, 'S', 0, 0, 0, 4)
	if len(w.buf) > math.MaxInt32 {
		return errWireTooLarge
	}
	nc := pg.Conn()
	if err := nc.SetDeadline(deadline); err != nil {
		w.close()
		return &wireError{err: err}
	}
	var (
		stop    func() bool
		stopped chan struct{} // made only for a context that can end: a flight otherwise allocates nothing here
	)
	if cancel.Done() != nil {
		stopped = make(chan struct{})
		stop = context.AfterFunc(cancel, func() {
			defer close(stopped)
			_ = nc.SetDeadline(time.Now())
		})
	}
	err := w.exchange()
	if stop != nil && !stop() {
		// The deadline was set to now: wait for that. The step fails even
		// if the exchange completed as the context ended: only the claim's
		// steps take a context that ends (the client's), and they roll
		// back when the connection closes.
		<-stopped
		err = &wireError{err: errors.Join(err, cancel.Err())}
	}
	if err == nil && w.stale != nil {
		// The connection's prepared statements are not what w.prepared
		// says (see staleStatement): the connection is dropped, with the
		// transaction, and the next one prepares afresh. The server
		// refused the statement, so what the flight ran rolls back: the
		// claim may be tried again on another connection.
		err = &wireError{err: w.stale, safeToRetry: true}
	}
	if err != nil {
		w.close()
		return err
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		w.close()
		return &wireError{err: err}
	}
	return nil
}

// staleStatement reports whether code, the SQLSTATE of an error one of
// the wire's named statements met, shows that the connection's prepared
// statements are not what the wire took them for: one deallocated
// (invalid_sql_statement_name: DEALLOCATE or DISCARD ALL through the
// handler's connection, or a pooler that reset the server session), one
// prepared already (duplicate_prepared_statement, once some of them were
// deallocated), or one whose result type a schema change moved
// (feature_not_supported: "cached plan must not change result type",
// which the statement then answers until it is prepared again). The wire
// cannot tell which of its statements the server still holds, so the
// connection goes.
func staleStatement(code string) bool {
	switch code {
	case "26000", "42P05", "0A000":
		return true
	}
	return false
}

// exchange writes the flight and reads the answers.
func (w *wireConn) exchange() error {
	if n, err := w.pg.Conn().Write(w.buf); err != nil {
		return &wireError{err: fmt.Errorf("write: %w", err), safeToRetry: n == 0}
	}
	i, parsed := 0, 0 // the statement answering, the Parses answered
	for {
		// The context is not cancellable (the deadline bounds the step),
		// so ReceiveMessage watches nothing.
		msg, err := w.pg.ReceiveMessage(context.Background())
		if err != nil {
			return &wireError{err: err}
		}
		switch msg := msg.(type) {
		case *pgproto3.ParseComplete:
			if parsed >= len(w.parsing) && w.named {
				return &wireError{err: errors.New("unexpected ParseComplete")}
			}
			if w.named {
				w.prepared[w.parsing[parsed]] = struct{}{}
			}
			parsed++
		case *pgproto3.BindComplete:
		case *pgproto3.DataRow:
			if i >= len(w.res) {
				return &wireError{err: errors.New("unexpected DataRow")}
			}
			w.keepRow(&w.res[i], msg.Values)
		case *pgproto3.CommandComplete:
			if i >= len(w.res) {
				return &wireError{err: errors.New("unexpected CommandComplete")}
			}
			r := &w.res[i]
			r.done = true
			r.ntag = copy(r.tag[:], msg.CommandTag)
			i++
		case *pgproto3.ErrorResponse:
			pgErr := pgconn.ErrorResponseToPgError(msg)
			if w.named && staleStatement(pgErr.Code) {
				w.stale = pgErr
			}
			if i < len(w.res) {
				w.res[i].err = pgErr
			} else if len(w.res) > 0 {
				w.res[len(w.res)-1].err = pgErr
			}
			i = len(w.res) // the server skips the rest of the flight
		case *pgproto3.ReadyForQuery:
			return nil
		case *pgproto3.NoticeResponse, *pgproto3.ParameterStatus, *pgproto3.NotificationResponse:
			// pgconn has handed them to the connection's callbacks.
		default:
			return &wireError{err: fmt.Errorf("unexpected message %T", msg)}
		}
	}
}

// keepRow copies the values of a statement's first row.
func (w *wireConn) keepRow(r *wireResult, values [][]byte) {
	if r.nvals > 0 || len(values) > len(r.off) {
		r.nvals = max(r.nvals, 1) // a second row, or too many columns: decoders check the count
		return
	}
	for j, v := range values {
		r.off[j] = len(w.vals)
		if v == nil {
			r.n[j] = -1
			continue
		}
		r.n[j] = len(v)
		w.vals = append(w.vals, v...)
	}
	r.nvals = len(values)
}

// close closes the connection after a failed step: the pool then
// destroys it. The deadline, if it passed, bounds the goodbye.
func (w *wireConn) close() {
	clear(w.prepared)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = w.pg.Close(ctx)
}

// trimBuf drops a write buffer grown by a large flight, once it is sent.
func (w *wireConn) trimBuf() {
	if cap(w.buf) > maxKeptBuffer {
		w.buf = nil
	}
}

// trim drops the buffers grown by a large flight. It is called as the
// connection goes back to the pool, once the flight's answers are
// decoded: the results refer into vals, so that dropping it when the
// flight ended (as run once did) made the decoding of a large row (a
// replay of a response over 64 KiB) panic, and the connection was never
// given back (TestTxWireReplaysLargeResponse).
func (w *wireConn) trim() {
	w.trimBuf()
	if cap(w.vals) > maxKeptBuffer {
		w.vals = nil
	}
}

// The answers, by statement.

// result returns statement i's answer: its error, or an error if it did
// not complete.
func (w *wireConn) result(i int) (*wireResult, error) {
	r := &w.res[i]
	switch {
	case r.err != nil:
		return r, r.err
	case !r.done:
		return r, errors.New("statement skipped after an earlier error")
	}
	return r, nil
}

// firstErr returns the first statement error of the flight, if any.
func (w *wireConn) firstErr() error {
	for i := range w.res {
		if _, err := w.result(i); err != nil {
			return err
		}
	}
	return nil
}

func (r *wireResult) tagIs(s string) bool { return string(r.tag[:r.ntag]) == s }

// value returns column j of the first row, nil for NULL; ok is false
// when the row has another number of columns than want.
func (w *wireConn) value(r *wireResult, j, want int) (v []byte, ok bool) {
	if r.nvals != want {
		return nil, false
	}
	switch {
	case r.n[j] < 0:
		return nil, true
	case r.n[j] == 0:
		return []byte{}, true // not NULL (w.vals may be nil)
	}
	return w.vals[r.off[j] : r.off[j]+r.n[j]], true
}

// errBadValue: a value is not in the binary form of its type.
var errBadValue = errors.New("unexpected value in a result")

// decodeTID decodes a row's physical place (PostgreSQL's ctid).
func decodeTID(b []byte) (pgtype.TID, error) {
	if len(b) != 6 {
		return pgtype.TID{}, errBadValue
	}
	return pgtype.TID{BlockNumber: binary.BigEndian.Uint32(b), OffsetNumber: binary.BigEndian.Uint16(b[4:]), Valid: true}, nil
}

func decodeBool(b []byte) (bool, error) {
	if len(b) != 1 || b[0] > 1 {
		return false, errBadValue
	}
	return b[0] == 1, nil
}

func decodeInt8(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, errBadValue
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}
