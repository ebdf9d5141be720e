//go:build go1.26

package msgsim

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/inbox"
)

// The modelled database: the inbox's table, its ledger's table and the
// business's effects, reached by the real inbox.SQL and inbox.SQLLedger
// through database/sql and a driver of this file's. It answers the
// statements those two make (SQLite's dialect: the engine probe says
// SQLite, so no PostgreSQL timeouts are set) with the semantics of a real
// database at READ COMMITTED: a transaction's writes are seen by others
// only once it commits, and all or none of them commit; an INSERT ... ON
// CONFLICT or an UPDATE of a row another open transaction wrote waits
// until that transaction ends; a plain SELECT never waits. A statement it
// does not know fails the seed (invSQL): a change of the inbox's SQL must
// be modelled here, not silently answered.
//
// Every statement and every commit takes a turn from the driver
// (world.turn): the order in which two consumers reach the database is
// the seed's. A rollback takes none: it only releases (database/sql rolls
// a transaction back from a goroutine of its own when the context ends,
// and releasing commutes with everything a rollback can race with).

const (
	inboxTable  = inbox.DefaultTable
	ledgerTable = inbox.DefaultTable + "_ledger"
	effectSQL   = "INSERT INTO effects (id) VALUES ($1)"
)

type rowKey struct{ consumer, id string }

// lockKey names a row lock: the table ('i' the inbox, 'l' the ledger)
// and the row.
type lockKey struct {
	table byte
	row   rowKey
}

type ledgerRow struct{ failures, running int }

// database is the modelled database's committed state; world.mu guards
// it.
type database struct {
	inbox    map[rowKey]int // format
	ledger   map[rowKey]ledgerRow
	inboxAt  map[rowKey]int64 // processed_at, the database's clock in Unix microseconds
	ledgerAt map[rowKey]int64 // updated_at
	effects  map[string]int   // committed effects by message id
	locks    map[lockKey]*dbTx
	open     map[*dbTx]bool
	down     bool
	txSeq    int
}

func newDatabase() *database {
	return &database{inbox: map[rowKey]int{}, ledger: map[rowKey]ledgerRow{}, effects: map[string]int{},
		inboxAt: map[rowKey]int64{}, ledgerAt: map[rowKey]int64{},
		locks: map[lockKey]*dbTx{}, open: map[*dbTx]bool{}}
}

// ledgerOp is a ledger write a transaction staged, with the run it is
// for, so that the oracle learns what was really applied (whatever the
// commit answered).
type ledgerOp struct {
	op  inbox.Op
	key rowKey
}

// dbTx is a transaction of the modelled database.
type dbTx struct {
	n        int
	p        *proc
	run      *runRec // the run whose transaction it is; nil for none
	kind     string  // the turn kind of its commit
	locks    []lockKey
	inbox    map[rowKey]int        // -1: deleted
	ledger   map[rowKey]*ledgerRow // nil value: deleted
	at       map[rowKey]int64      // the inbox rows' processed_at it wrote
	lat      map[rowKey]int64      // the ledger rows' updated_at it wrote
	effects  []string
	ops      []ledgerOp
	done     bool
	aborted  bool // a statement failed in it: every later one fails (PostgreSQL's aborted transaction)
	released chan struct{}
}

// errUniqueViolation is a plain insert's unique violation, spelt as
// PostgreSQL's drivers spell it (SQLSTATE 23505), which
// inbox.IsUniqueViolation reads.
type errUniqueViolation struct{}

func (errUniqueViolation) Error() string {
	return "msgsim: duplicate key value violates unique constraint"
}
func (errUniqueViolation) SQLState() string { return "23505" }

var errAborted = errors.New("msgsim: current transaction is aborted, commands ignored until end of transaction block")

var (
	errDown     = errors.New("msgsim: the database is unreachable")
	errTxGone   = errors.New("msgsim: the transaction is gone (its connection died)")
	errCommit   = errors.New("msgsim: commit failed")
	errUnknown  = errors.New("msgsim: statement not modelled")
	errNotInTx  = errors.New("msgsim: statement outside a transaction")
	errProcDead = errors.New("msgsim: the process is dead")
)

// connector opens connections of proc p to the world's database.
type connector struct{ p *proc }

func (c connector) Connect(context.Context) (driver.Conn, error) { return &conn{p: c.p}, nil }
func (c connector) Driver() driver.Driver                        { return drv{} }

type drv struct{}

func (drv) Open(string) (driver.Conn, error) {
	return nil, errors.New("msgsim: open through the connector")
}

// openDB is p's database/sql pool, as a process has its own.
func openDB(p *proc) *sql.DB { return sql.OpenDB(connector{p: p}) }

type conn struct {
	p  *proc
	tx *dbTx
}

var (
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
)

func (c *conn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("msgsim: no prepared statements")
}
func (c *conn) PrepareContext(context.Context, string) (driver.Stmt, error) {
	return nil, errors.New("msgsim: no prepared statements")
}

func (c *conn) Close() error {
	if c.tx != nil {
		c.p.w.rollback(c.tx)
		c.tx = nil
	}
	return nil
}

func (c *conn) Begin() (driver.Tx, error) { return c.BeginTx(context.Background(), driver.TxOptions{}) }

func (c *conn) BeginTx(ctx context.Context, _ driver.TxOptions) (driver.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := c.p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.p.isDead() {
		return nil, errProcDead
	}
	w.db.txSeq++
	tx := &dbTx{n: w.db.txSeq, p: c.p, run: runFrom(ctx), kind: kindFrom(ctx), inbox: map[rowKey]int{},
		ledger: map[rowKey]*ledgerRow{}, at: map[rowKey]int64{}, lat: map[rowKey]int64{}, released: make(chan struct{})}
	w.db.open[tx] = true
	c.tx = tx
	return txHandle{c: c, tx: tx}, nil
}

type txHandle struct {
	c  *conn
	tx *dbTx
}

func (t txHandle) Commit() error {
	if t.c.tx == t.tx {
		t.c.tx = nil
	}
	return t.c.p.w.commit(t.tx)
}

func (t txHandle) Rollback() error {
	if t.c.tx == t.tx {
		t.c.tx = nil
	}
	t.c.p.w.rollback(t.tx)
	return nil
}

func (c *conn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	n, _, err := c.statement(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return driver.RowsAffected(n), nil
}

func (c *conn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	// The engine probe (inbox.SQL asks once per pool which engine it
	// is) reads nothing of the database's.
	switch q {
	case "SELECT current_setting('server_version_num')":
		return nil, errors.New("msgsim: no such function: current_setting")
	case "SELECT sqlite_version()":
		return &rows{cols: []string{"v"}, vals: [][]driver.Value{{"3.46.0"}}}, nil
	}
	_, r, err := c.statement(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// statement runs q in c's transaction, in a turn of its own, waiting
// (outside any turn) for a row another transaction holds.
func (c *conn) statement(ctx context.Context, q string, args []driver.NamedValue) (int64, *rows, error) {
	w := c.p.w
	if c.tx == nil && strings.HasPrefix(q, "DELETE FROM ") && strings.Contains(q, " WHERE (consumer, id) IN (SELECT consumer, id FROM ") {
		// SQL.Prune's statements, each a transaction of its own
		// (autocommit): its commit takes a turn as any other.
		if _, err := c.BeginTx(ctx, driver.TxOptions{}); err != nil {
			return 0, nil, err
		}
		tx := c.tx
		n, r, err := c.statement(ctx, q, args)
		c.tx = nil
		if err != nil {
			w.rollback(tx)
			return 0, nil, err
		}
		return n, r, w.commit(tx)
	}
	if c.tx == nil {
		w.failf(invSQL, "", "a statement outside a transaction: %q", q)
		return 0, nil, errNotInTx
	}
	for {
		if err := w.turn(ctx, c.p, c.tx.run, kindFrom(ctx)); err != nil {
			return 0, nil, err
		}
		n, r, wait, err := w.exec(c.tx, q, args)
		if wait == nil {
			return n, r, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-c.p.killed:
			return 0, nil, errProcDead
		}
	}
}

type rows struct {
	cols []string
	vals [][]driver.Value
	i    int
}

func (r *rows) Columns() []string { return r.cols }
func (r *rows) Close() error      { return nil }
func (r *rows) Next(dest []driver.Value) error {
	if r.i >= len(r.vals) {
		return io.EOF
	}
	copy(dest, r.vals[r.i])
	r.i++
	return nil
}

func argString(args []driver.NamedValue, i int) string {
	if i < len(args) {
		if s, ok := args[i].Value.(string); ok {
			return s
		}
	}
	return ""
}

// exec runs one statement of tx; it runs in a turn. wait, when not nil,
// is the end of the transaction holding a row the statement needs: run
// it again once that ends.
func (w *world) exec(tx *dbTx, q string, args []driver.NamedValue) (n int64, r *rows, wait <-chan struct{}, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	db := w.db
	switch {
	case tx.done:
		return 0, nil, nil, errTxGone
	case tx.aborted:
		return 0, nil, nil, errAborted
	case db.down:
		w.logf("%s: %s: database unreachable", tx.p.name, shortSQL(q))
		return 0, nil, nil, errDown
	}
	k := rowKey{argString(args, 0), argString(args, 1)}
	lock := func(table byte) <-chan struct{} {
		lk := lockKey{table, k}
		if h := db.locks[lk]; h != nil && h != tx {
			return h.released
		}
		if db.locks[lk] == nil {
			db.locks[lk] = tx
			tx.locks = append(tx.locks, lk)
		}
		return nil
	}
	inboxRow := func() (int, bool) {
		if f, ok := tx.inbox[k]; ok {
			return f, f >= 0
		}
		f, ok := db.inbox[k]
		return f, ok
	}
	ledgerRowOf := func() (ledgerRow, bool) {
		if l, ok := tx.ledger[k]; ok {
			if l == nil {
				return ledgerRow{}, false
			}
			return *l, true
		}
		l, ok := db.ledger[k]
		return l, ok
	}
	prefix := func(s string) bool { return strings.HasPrefix(q, s) }
	now := w.now().UnixMicro() // the database's clock
	// A batch's statements name their ids in args[1:] (consumer first).
	batchKeys := func() []rowKey {
		ks := make([]rowKey, 0, len(args))
		for i := 1; i < len(args); i++ {
			ks = append(ks, rowKey{argString(args, 0), argString(args, i)})
		}
		return ks
	}
	// lockAll takes the row lock of each of ks in order (as the engine
	// does, keeping those taken when it must wait for one).
	lockAll := func(ks []rowKey) <-chan struct{} {
		for _, bk := range ks {
			lk := lockKey{'i', bk}
			if h := db.locks[lk]; h != nil && h != tx {
				return h.released
			}
			if db.locks[lk] == nil {
				db.locks[lk] = tx
				tx.locks = append(tx.locks, lk)
			}
		}
		return nil
	}
	rowOf := func(bk rowKey) (int, bool) {
		if f, ok := tx.inbox[bk]; ok {
			return f, f >= 0
		}
		f, ok := db.inbox[bk]
		return f, ok
	}
	idRows := func(ids []string) *rows {
		r := &rows{cols: []string{"id"}}
		for _, id := range ids {
			r.vals = append(r.vals, []driver.Value{id})
		}
		return r
	}
	switch {
	case prefix("INSERT INTO " + inboxTable + " (consumer, id, processed_at, format) SELECT $1, column1, "):
		// ProcessBatch's insert of several ids (insertRows): plain (a
		// unique violation when any id is there, the transaction
		// aborted), or ON CONFLICT DO NOTHING RETURNING id (the ids it
		// inserted).
		if !strings.HasSuffix(q, ") AS ids WHERE true") && !strings.HasSuffix(q, ") AS ids WHERE true ON CONFLICT DO NOTHING RETURNING id") {
			w.failf(invSQL, "", "a batch insert not modelled: %q", q)
			return 0, nil, nil, errUnknown
		}
		format := 0
		if i := strings.Index(q, " FROM (VALUES "); i >= 0 {
			if j := strings.LastIndex(q[:i], ", "); j >= 0 {
				fmt.Sscanf(q[j+2:i], "%d", &format)
			}
		}
		ks := batchKeys()
		if wait := lockAll(ks); wait != nil {
			w.logf("%s: batch insert waits for another transaction", tx.p.name)
			return 0, nil, wait, nil
		}
		returning := strings.HasSuffix(q, "RETURNING id")
		var fresh []string
		for _, bk := range ks {
			if _, ok := rowOf(bk); ok {
				if !returning {
					tx.aborted = true
					w.logf("%s: batch insert: %s there already (unique violation)", tx.p.name, bk.id)
					return 0, nil, nil, errUniqueViolation{}
				}
				continue
			}
			fresh = append(fresh, bk.id)
		}
		for _, id := range fresh {
			tx.inbox[rowKey{argString(args, 0), id}] = format
			tx.at[rowKey{argString(args, 0), id}] = now
		}
		w.logf("%s: batch insert %v: new %v", tx.p.name, ks, fresh)
		if returning {
			return int64(len(fresh)), idRows(fresh), nil, nil
		}
		return int64(len(fresh)), nil, nil, nil
	case prefix("SELECT id FROM "+inboxTable+" WHERE consumer = $1 AND format = 4 AND id IN (") && strings.HasSuffix(q, ") LIMIT 1"):
		// ProcessBatch's tombstone check (batchTombstone): a plain
		// select, it never waits.
		for _, bk := range batchKeys() {
			if f, ok := rowOf(bk); ok && f == 4 {
				w.logf("%s: batch reads the tombstone of %s", tx.p.name, bk.id)
				return 0, idRows([]string{bk.id}), nil, nil
			}
		}
		return 0, idRows(nil), nil, nil
	case prefix("UPDATE "+inboxTable+" SET format = ") && strings.Contains(q, " WHERE consumer = $1 AND format = 3 AND id IN (") && strings.HasSuffix(q, ") RETURNING id"):
		// insertReturning's take-over of other id spaces' copies.
		ks := batchKeys()
		if wait := lockAll(ks); wait != nil {
			return 0, nil, wait, nil
		}
		to := 0
		fmt.Sscanf(strings.TrimPrefix(q, "UPDATE "+inboxTable+" SET format = "), "%d", &to)
		var taken []string
		for _, bk := range ks {
			if f, ok := rowOf(bk); ok && f == 3 {
				tx.inbox[bk] = to
				tx.at[bk] = now
				taken = append(taken, bk.id)
			}
		}
		return int64(len(taken)), idRows(taken), nil, nil
	case prefix("INSERT INTO " + inboxTable + " (consumer, id, processed_at, format) VALUES ($1, $2, "):
		// recordOne's insert: ON CONFLICT DO NOTHING, the format last.
		format := 0
		if i := strings.LastIndex(q, ", "); i >= 0 {
			fmt.Sscanf(q[i+2:], "%d)", &format)
		}
		if wait := lock('i'); wait != nil {
			w.logf("%s: inbox insert %s waits for another transaction", tx.p.name, k.id)
			return 0, nil, wait, nil
		}
		if _, ok := inboxRow(); ok {
			w.logf("%s: inbox insert %s: there already", tx.p.name, k.id)
			return 0, nil, nil, nil
		}
		tx.inbox[k] = format
		tx.at[k] = now
		w.logf("%s: inbox insert %s", tx.p.name, k.id)
		return 1, nil, nil, nil
	case prefix("DELETE FROM "+inboxTable+" WHERE (consumer, id) IN (SELECT consumer, id FROM "+inboxTable+" WHERE processed_at < ") && strings.HasSuffix(q, " - $1 LIMIT 1000)"),
		prefix("DELETE FROM "+ledgerTable+" WHERE (consumer, id) IN (SELECT consumer, id FROM "+ledgerTable+" WHERE updated_at < ") && strings.HasSuffix(q, " - $1 LIMIT 1000)"):
		// SQL.Prune: the rows older than $1 microseconds by the
		// database's clock, a thousand at most; each row another
		// transaction holds is waited for.
		age, _ := args[0].Value.(int64)
		ledger := prefix("DELETE FROM " + ledgerTable)
		at := db.inboxAt
		if ledger {
			at = db.ledgerAt
		}
		var ks []rowKey
		for k, t := range at {
			if t < now-age {
				ks = append(ks, k)
			}
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i].consumer+"/"+ks[i].id < ks[j].consumer+"/"+ks[j].id })
		ks = ks[:min(len(ks), 1000)]
		table := byte('i')
		if ledger {
			table = 'l'
		}
		for _, pk := range ks {
			lk := lockKey{table, pk}
			if h := db.locks[lk]; h != nil && h != tx {
				return 0, nil, h.released, nil
			}
		}
		for _, pk := range ks {
			lk := lockKey{table, pk}
			if db.locks[lk] == nil {
				db.locks[lk] = tx
				tx.locks = append(tx.locks, lk)
			}
			if ledger {
				tx.ledger[pk] = nil
				tx.ops = append(tx.ops, ledgerOp{inbox.OpForget, pk})
			} else {
				tx.inbox[pk] = -1
			}
		}
		w.logf("%s: prune of %s older than %v: %d rows", tx.p.name, map[bool]string{false: "the inbox", true: "the ledger"}[ledger], time.Duration(age)*time.Microsecond, len(ks))
		return int64(len(ks)), nil, nil, nil
	case prefix("DELETE FROM " + inboxTable + " WHERE consumer = $1 AND id = $2 AND format = 4"):
		// SQLLedger.Redrive clears the tombstone (-1: deleted at commit).
		if wait := lock('i'); wait != nil {
			return 0, nil, wait, nil
		}
		if f, ok := inboxRow(); ok && f == 4 {
			tx.inbox[k] = -1
			return 1, nil, nil, nil
		}
		return 0, nil, nil, nil
	case prefix("SELECT format FROM " + inboxTable + " WHERE consumer = $1 AND id = $2"):
		f, ok := inboxRow()
		if !ok {
			return 0, &rows{cols: []string{"format"}}, nil, nil
		}
		return 0, &rows{cols: []string{"format"}, vals: [][]driver.Value{{int64(f)}}}, nil, nil
	case prefix("UPDATE " + inboxTable + " SET format = "):
		// claimCopy, or a tombstone's: another id space's copy taken
		// over. No id spaces here: it never matches.
		to := 0
		fmt.Sscanf(strings.TrimPrefix(q, "UPDATE "+inboxTable+" SET format = "), "%d", &to)
		if wait := lock('i'); wait != nil {
			return 0, nil, wait, nil
		}
		if f, ok := inboxRow(); ok && f == 3 {
			tx.inbox[k] = to
			tx.at[k] = now
			return 1, nil, nil, nil
		}
		return 0, nil, nil, nil
	case prefix("SELECT EXISTS (SELECT 1 FROM " + inboxTable + " WHERE consumer = $1 AND id = $3"):
		// The ledger's OpBegin, OpFail, OpFailBegun, OpTombstone: is the
		// message processed (not a copy, not a tombstone), is it
		// dead-lettered (a tombstone)? Args: consumer, legacy, id.
		own := rowKey{argString(args, 0), argString(args, 2)}
		legacy := rowKey{argString(args, 1), argString(args, 2)}
		f1, ok1 := db.inbox[own]
		f2, ok2 := db.inbox[legacy]
		if g, ok := tx.inbox[own]; ok {
			f1, ok1 = g, g >= 0
		}
		processed := (ok1 && f1 != 3 && f1 != 4) || (ok2 && f2 == 1)
		dead := ok1 && f1 == 4
		return 0, &rows{cols: []string{"processed", "dead"}, vals: [][]driver.Value{{processed, dead}}}, nil, nil
	case prefix("INSERT INTO " + ledgerTable + " "):
		var op inbox.Op
		switch {
		case strings.Contains(q, "running = "+ledgerTable+".running + 1"):
			op = inbox.OpBegin
		case strings.Contains(q, "failures = "+ledgerTable+".failures + 1, running = CASE"):
			op = inbox.OpFailBegun
		case strings.Contains(q, "failures = "+ledgerTable+".failures + 1"):
			op = inbox.OpFail
		default:
			w.failf(invSQL, k.id, "a ledger upsert not modelled: %q", q)
			return 0, nil, nil, errUnknown
		}
		if wait := lock('l'); wait != nil {
			return 0, nil, wait, nil
		}
		l, _ := ledgerRowOf()
		switch op {
		case inbox.OpBegin:
			l.running++
		case inbox.OpFail:
			l.failures++
		case inbox.OpFailBegun:
			l.failures++
			l.running = max(l.running-1, 0)
		}
		tx.ledger[k] = &l
		tx.lat[k] = now
		tx.ops = append(tx.ops, ledgerOp{op, k})
		return 1, nil, nil, nil
	case prefix("SELECT failures, running FROM " + ledgerTable + " WHERE consumer = $1 AND id = $2"):
		l, ok := ledgerRowOf()
		if !ok {
			return 0, &rows{cols: []string{"failures", "running"}}, nil, nil
		}
		return 0, &rows{cols: []string{"failures", "running"}, vals: [][]driver.Value{{int64(l.failures), int64(l.running)}}}, nil, nil
	case prefix("UPDATE " + ledgerTable + " SET running = CASE WHEN running > 0 THEN running - 1 ELSE 0 END"):
		if wait := lock('l'); wait != nil {
			return 0, nil, wait, nil
		}
		l, ok := ledgerRowOf()
		if !ok {
			return 0, nil, nil, nil
		}
		l.running = max(l.running-1, 0)
		tx.ledger[k] = &l
		tx.lat[k] = now
		tx.ops = append(tx.ops, ledgerOp{inbox.OpExcuse, k})
		return 1, nil, nil, nil
	case prefix("DELETE FROM " + ledgerTable + " WHERE consumer = $1 AND id = $2"):
		if wait := lock('l'); wait != nil {
			return 0, nil, wait, nil
		}
		_, ok := ledgerRowOf()
		tx.ledger[k] = nil
		tx.ops = append(tx.ops, ledgerOp{inbox.OpForget, k})
		if ok {
			return 1, nil, nil, nil
		}
		return 0, nil, nil, nil
	case q == effectSQL:
		tx.effects = append(tx.effects, argString(args, 0))
		w.logf("%s: effect of %s staged", tx.p.name, argString(args, 0))
		return 1, nil, nil, nil
	}
	w.failf(invSQL, "", "a statement not modelled: %q", q)
	return 0, nil, nil, errUnknown
}

// shortSQL is the first words of q, for the trace.
func shortSQL(q string) string {
	f := strings.Fields(q)
	return strings.Join(f[:min(len(f), 3)], " ")
}

// commit commits tx in a turn of its own: all of its writes, or none. A
// commit may fail (Config.CommitFail) before it applies or after (the
// answer lost: the outcome unknown to the caller).
func (w *world) commit(tx *dbTx) error {
	if err := w.turn(context.Background(), tx.p, tx.run, tx.kind); err != nil {
		w.rollback(tx)
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	db := w.db
	if tx.done {
		return errTxGone
	}
	if tx.aborted {
		w.end(tx)
		return errAborted
	}
	if db.down {
		w.end(tx)
		w.logf("%s: commit: database unreachable", tx.p.name)
		return errDown
	}
	fail := w.faulty && w.cfg.CommitFail > 0 && w.drng.IntN(1000) < w.cfg.CommitFail
	if fail && w.drng.IntN(2) == 0 {
		w.end(tx)
		w.stat("commit failed before")
		w.logf("%s: commit failed (not applied)", tx.p.name)
		return errCommit
	}
	ks := make([]rowKey, 0, len(tx.inbox))
	for k := range tx.inbox {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].consumer+"/"+ks[i].id < ks[j].consumer+"/"+ks[j].id })
	for _, k := range ks {
		f := tx.inbox[k]
		key := keyOfRow(k)
		switch {
		case f < 0 && tx.p == w.pruner:
			delete(db.inbox, k)
			delete(db.inboxAt, k)
			w.pruned(k)
			continue
		case f < 0:
			// The operator's redrive: its tombstone cleared.
			delete(db.inbox, k)
			delete(db.inboxAt, k)
			if rd := w.redriven[key]; rd != nil {
				rd.tombs = w.tombs[key]
			}
			w.logf("%s: tombstone of %s cleared", tx.p.name, key)
			continue
		case f == 4:
			w.tombs[key]++
			w.logf("%s: tombstone of %s committed", tx.p.name, key)
		}
		db.inbox[k] = f
		db.inboxAt[k] = tx.at[k]
	}
	keys := make([]rowKey, 0, len(tx.ledger))
	for k := range tx.ledger {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].id < keys[j].id })
	for _, k := range keys {
		if l := tx.ledger[k]; l == nil {
			delete(db.ledger, k)
			delete(db.ledgerAt, k)
		} else {
			db.ledger[k] = *l
			db.ledgerAt[k] = tx.lat[k]
		}
	}
	for _, id := range tx.effects {
		db.effects[id]++
		w.logf("%s: effect of %s committed (%d)", tx.p.name, id, db.effects[id])
		if db.effects[id] > 1 {
			w.failLocked(invOnce, id, "the effect of %s committed %d times", id, db.effects[id])
		}
	}
	for _, o := range tx.ops {
		w.logf("%s: ledger %s %s: %+v", tx.p.name, o.op, o.key.id, db.ledger[o.key])
		w.ledgerApplied(tx, o)
	}
	w.end(tx)
	if fail {
		w.stat("commit failed after")
		w.logf("%s: commit applied, its answer lost", tx.p.name)
		return errCommit
	}
	if len(tx.effects) == 0 && len(tx.ops) == 0 && len(tx.inbox) > 0 {
		w.logf("%s: commit", tx.p.name)
	}
	return nil
}

// rollback ends tx with nothing written; it takes no turn (see the top
// of this file).
func (w *world) rollback(tx *dbTx) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.end(tx)
}

// end ends tx: its locks released, its waiters woken. w.mu is held.
func (w *world) end(tx *dbTx) {
	if tx.done {
		return
	}
	tx.done = true
	for _, lk := range tx.locks {
		if w.db.locks[lk] == tx {
			delete(w.db.locks, lk)
		}
	}
	delete(w.db.open, tx)
	close(tx.released)
}

// killTxs rolls back every open transaction of p (its connections died
// with it). w.mu is held.
func (w *world) killTxs(p *proc) {
	txs := make([]*dbTx, 0)
	for tx := range w.db.open {
		if tx.p == p {
			txs = append(txs, tx)
		}
	}
	sort.Slice(txs, func(i, j int) bool { return txs[i].n < txs[j].n })
	for _, tx := range txs {
		w.end(tx)
	}
}
