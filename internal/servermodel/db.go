package servermodel

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// DB is a modelled transactional database as TxMiddleware uses it: the
// key table (committed rows: a claim, with record nil, or a completed
// record, each live until it expires on Now), transaction-level advisory
// locks on keys, and a ledger of the business's committed effects. A
// transaction's writes (its claim row, its record, its effects) commit
// together or not at all; a transaction's lock is released when it
// commits or rolls back. Statements see what is committed, and their own
// transaction's writes (READ COMMITTED).
//
// The zero value is an empty database on the wall clock; set Now and
// Faults before first use. It is safe for concurrent use.
type DB struct {
	// Now is the database's clock (now()); nil means time.Now.
	Now func() time.Time
	// Faults decides the fault of each statement the middleware sends
	// (OpClaim, OpComplete, OpRelease, OpLookup, OpMark); nil: none.
	// The handler's own statements ([HandlerTx]) do not fail by it.
	Faults Faults
	// Wait is how a statement that hangs waits; nil: until its context
	// ends.
	Wait Wait

	mu      sync.Mutex
	rows    map[string]dbRow
	ledger  []Effect
	locks   map[string]int // key → the id of the transaction holding its lock
	txs     int
	pools   map[string][]*Tx // the transactions of each named pool ([TxServer.Pool]), for Drop
	dropped map[string]bool  // pools whose connections are gone
}

// dbRow is a row of the key table.
type dbRow struct {
	token, fingerprint string
	record             []byte
	expires            time.Time
}

// Effect is one committed effect of the business.
type Effect struct {
	Key  string // the store key of the request that made it
	Name string
}

// Write commits the effect name of key at once, outside any transaction
// (a statement in autocommit): the business write of a server whose
// effects happen as its handler runs (idemserver.Middleware's), which no
// record commits with.
func (db *DB) Write(key, name string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.ledger = append(db.ledger, Effect{Key: key, Name: name})
}

// Drop ends every connection of pool, as a server process that dies
// does: the database rolls back their open transactions and releases
// their locks at once, and every later statement on them, or on a new
// connection of the pool, fails with [ErrLost]. (What a transaction
// committed stays.)
func (db *DB) Drop(pool string) {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.dropped == nil {
		db.dropped = map[string]bool{}
	}
	db.dropped[pool] = true
	for _, tx := range db.pools[pool] {
		tx.endLocked(false)
		tx.state = txBroken
	}
	delete(db.pools, pool)
}

func (db *DB) now() time.Time {
	if db.Now != nil {
		return db.Now()
	}
	return time.Now()
}

// Effects returns the committed effects, in commit order.
func (db *DB) Effects() []Effect {
	db.mu.Lock()
	defer db.mu.Unlock()
	return slices.Clone(db.ledger)
}

// EffectsOf returns how many committed effects key has.
func (db *DB) EffectsOf(key string) int {
	n := 0
	for _, e := range db.Effects() {
		if e.Key == key {
			n++
		}
	}
	return n
}

// Row returns key's live committed row: its record (nil for a claim),
// and whether there is one.
func (db *DB) Row(key string) (record []byte, ok bool) {
	db.mu.Lock()
	defer db.mu.Unlock()
	r, ok := db.rows[key]
	if !ok || !db.now().Before(r.expires) {
		return nil, false
	}
	return r.record, true
}

// live returns key's live committed row. The caller holds db.mu.
func (db *DB) live(key string, now time.Time) (dbRow, bool) {
	r, ok := db.rows[key]
	if !ok || !now.Before(r.expires) {
		return dbRow{}, false
	}
	return r, true
}

// txState is a transaction's state on its connection.
type txState uint8

const (
	txOpen txState = iota
	txAborted
	txIdle   // committed or rolled back: outside any transaction
	txBroken // the connection is gone
)

// Tx is a request's connection and its transaction.
type Tx struct {
	db      *DB
	pool    string // the connections it is on ([TxServer.Pool])
	faults  Faults // its shell's, or the DB's
	key     string // the claim's store key
	claimID int    // the claim's transaction
	id      int    // the open transaction (another after COMMIT AND CHAIN)
	began   time.Time
	state   txState
	locked  bool
	row     *dbRow // the claim row, written in the claim's transaction
	effects []Effect
}

// faults returns the faults of a shell's statements: its own, else the
// DB's.
func (db *DB) faults(own Faults) Faults {
	if own != nil {
		return own
	}
	return db.Faults
}

// claim begins a transaction on a connection of pool, tries key's lock
// and, with it, writes the claim row unless a live row holds the key;
// then it reads the key's live row. It returns the transaction when it
// claimed the key.
func (db *DB) claim(ctx context.Context, pool string, faults Faults, key, token, fp string, ttl time.Duration) (tx *Tx, locked, claimed bool, row servercore.Row, err error) {
	f, err := fault(ctx, db.faults(faults), db.Wait, OpClaim, key)
	if f.before() || f == Lose {
		// Lost before the answer: the connection, and the transaction
		// with it, are gone: nothing stays.
		return nil, false, false, servercore.Row{}, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.dropped[pool] {
		return nil, false, false, servercore.Row{}, ErrLost
	}
	now := db.now()
	db.txs++
	tx = &Tx{db: db, pool: pool, faults: faults, key: key, claimID: db.txs, id: db.txs, began: now}
	if _, busy := db.locks[key]; !busy {
		if db.locks == nil {
			db.locks = map[string]int{}
		}
		db.locks[key], locked, tx.locked = tx.id, true, true
		if _, live := db.live(key, now); !live {
			tx.row = &dbRow{token: token, fingerprint: fp, expires: now.Add(ttl)}
			if pool != "" {
				if db.pools == nil {
					db.pools = map[string][]*Tx{}
				}
				db.pools[pool] = append(db.pools[pool], tx)
			}
			return tx, true, true, servercore.Row{}, nil
		}
	}
	if r, live := db.live(key, now); live {
		row = servercore.Row{Exists: true, Completed: r.record != nil, Token: r.token, Fingerprint: r.fingerprint, Record: r.record}
	}
	tx.endLocked(false)
	return nil, locked, false, row, nil
}

// endLocked ends the open transaction: commits its writes or drops them,
// and releases its lock. The caller holds db.mu.
func (tx *Tx) endLocked(commit bool) {
	db := tx.db
	if tx.state == txOpen || tx.state == txAborted {
		if commit && tx.state == txOpen {
			if tx.row != nil && tx.id == tx.claimID {
				if db.rows == nil {
					db.rows = map[string]dbRow{}
				}
				db.rows[tx.key] = *tx.row
			}
			db.ledger = append(db.ledger, tx.effects...)
		}
	}
	if tx.id == tx.claimID {
		tx.row = nil
	}
	tx.effects = nil
	if tx.locked {
		if db.locks[tx.key] == tx.claimID {
			delete(db.locks, tx.key)
		}
		tx.locked = false
	}
	if tx.state != txBroken {
		tx.state = txIdle
	}
}

// txState is the transaction as the handler left it.
func (tx *Tx) txState() servercore.TxState {
	tx.db.mu.Lock()
	defer tx.db.mu.Unlock()
	switch {
	case tx.state == txBroken:
		return servercore.TxBroken
	case tx.state == txIdle:
		return servercore.TxIdle
	case tx.state == txAborted:
		return servercore.TxAborted
	}
	return servercore.TxOpen
}

// commit stores record in the claim row and commits, as TxMiddleware's
// guarded store and COMMIT do.
func (tx *Tx) commit(ctx context.Context, record []byte) servercore.Commit {
	f, _ := fault(ctx, tx.db.faults(tx.faults), tx.db.Wait, OpComplete, tx.key)
	db := tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	switch {
	case f == Refuse || f == Full:
		tx.endLocked(false)
		return servercore.CommitRefused
	case f == Hang:
		// The middleware gave up and closed the connection: the server
		// rolls back.
		tx.endLocked(false)
		tx.state = txBroken
		return servercore.CommitUnknown
	case tx.state == txBroken:
		return servercore.CommitUnknown
	case tx.state == txIdle || tx.id != tx.claimID:
		tx.endLocked(false)
		return servercore.CommitEnded
	case tx.state == txAborted:
		tx.endLocked(false)
		return servercore.CommitRefused
	case tx.row == nil || tx.row.record != nil:
		tx.endLocked(false)
		return servercore.CommitClaimLost
	}
	if plant.AfterCommit {
		return tx.commitApart(ctx, record, f)
	}
	tx.row.record = record
	tx.endLocked(true)
	if f == Lose {
		tx.state = txBroken
		return servercore.CommitUnknown
	}
	return servercore.CommitOK
}

// commitApart is the planted bug plant.AfterCommit: the transaction
// commits (the handler's effects, and the claim row), and then the record
// is stored in a transaction of its own, which may fail or never come
// (the process dies between the two): the claim row then holds the key,
// without a record, for the TTL. The caller holds db.mu; f is the
// COMMIT's fault.
func (tx *Tx) commitApart(ctx context.Context, record []byte, f Fault) servercore.Commit {
	db := tx.db
	key, token := tx.key, tx.row.token
	tx.endLocked(true)
	if f == Lose {
		tx.state = txBroken
		return servercore.CommitUnknown
	}
	db.mu.Unlock()
	f, _ = fault(ctx, db.faults(tx.faults), db.Wait, OpComplete, key)
	db.mu.Lock()
	r, live := db.rows[key]
	if f.before() || db.dropped[tx.pool] || !live || r.token != token {
		return servercore.CommitRefused
	}
	r.record = record
	db.rows[key] = r
	return servercore.CommitOK
}

// end rolls back and reports whether the handler had ended the claim's
// transaction itself.
func (tx *Tx) end(ctx context.Context) bool {
	f, _ := fault(ctx, tx.db.faults(tx.faults), tx.db.Wait, OpRelease, tx.key)
	db := tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	ended := tx.state == txIdle || (tx.state == txOpen && tx.id != tx.claimID)
	tx.endLocked(false)
	if f != Pass {
		// A failed ROLLBACK closes the connection, which rolls back.
		tx.state = txBroken
		return ended && f != Hang // a hung check tells nothing
	}
	return ended
}

// rollback ends whatever is open, without a check.
func (tx *Tx) rollback() {
	tx.db.mu.Lock()
	defer tx.db.mu.Unlock()
	tx.endLocked(false)
}

// mark keeps key completed with record over the request's own claim row
// (committed by the handler's COMMIT, perhaps) or an expired row.
func (db *DB) mark(ctx context.Context, pool string, faults Faults, key, token, fp string, record []byte, ttl time.Duration) error {
	f, err := fault(ctx, db.faults(faults), db.Wait, OpMark, key)
	if f.before() {
		return err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.dropped[pool] {
		return ErrLost
	}
	now := db.now()
	if r, live := db.live(key, now); !live || r.token == token {
		if db.rows == nil {
			db.rows = map[string]dbRow{}
		}
		db.rows[key] = dbRow{token: token, fingerprint: fp, record: record, expires: now.Add(ttl)}
	}
	return err
}

// lookup reads key's live committed row.
func (db *DB) lookup(ctx context.Context, pool string, faults Faults, key string) (servercore.Row, error) {
	if f, err := fault(ctx, db.faults(faults), db.Wait, OpLookup, key); f != Pass {
		return servercore.Row{}, err
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.dropped[pool] {
		return servercore.Row{}, ErrLost
	}
	r, live := db.live(key, db.now())
	if !live {
		return servercore.Row{}, nil
	}
	return servercore.Row{Exists: true, Completed: r.record != nil, Token: r.token, Fingerprint: r.fingerprint, Record: r.record}, nil
}

// HandlerTx is the transaction as a [TxServer]'s handler sees it: it
// writes effects in it, and, to model what a handler may do to its
// transaction, may commit it itself, commit and chain, roll it back, or
// leave it aborted by a failed statement.
type HandlerTx struct {
	tx     *Tx
	closed bool
}

// ErrAborted is what a statement gets in an aborted transaction.
var ErrAborted = errors.New("servermodel: current transaction is aborted")

// ErrClosed is what a statement gets once the handler has returned.
var ErrClosed = errors.New("servermodel: the transaction is closed")

// Effect writes the effect name in the transaction. Outside any
// transaction (after the handler's own COMMIT or ROLLBACK), it commits at
// once, as a statement sent outside a transaction does.
func (h *HandlerTx) Effect(name string) error {
	db := h.tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	e := Effect{Key: h.tx.key, Name: name}
	switch {
	case h.closed:
		return ErrClosed
	case h.tx.state == txAborted:
		return ErrAborted
	case h.tx.state == txBroken:
		return ErrLost
	case h.tx.state == txIdle:
		db.ledger = append(db.ledger, e)
		return nil
	}
	h.tx.effects = append(h.tx.effects, e)
	return nil
}

// Fail sends a statement that fails: the transaction is aborted.
func (h *HandlerTx) Fail() error {
	db := h.tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if h.tx.state == txOpen {
		h.tx.state = txAborted
	}
	return errors.New("servermodel: a statement failed")
}

// Commit sends COMMIT, as a handler may through its connection: its
// writes commit, the claim row with them, and the key's lock is released.
func (h *HandlerTx) Commit() {
	db := h.tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if !h.closed {
		h.tx.endLocked(true)
	}
}

// CommitAndChain sends COMMIT AND CHAIN: Commit, then a new transaction
// at once.
func (h *HandlerTx) CommitAndChain() {
	db := h.tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if h.closed || h.tx.state == txBroken {
		return
	}
	h.tx.endLocked(true)
	db.txs++
	h.tx.id, h.tx.state = db.txs, txOpen
}

// Rollback sends ROLLBACK: its writes go, the claim row with them.
func (h *HandlerTx) Rollback() {
	db := h.tx.db
	db.mu.Lock()
	defer db.mu.Unlock()
	if !h.closed {
		h.tx.endLocked(false)
	}
}

func (h *HandlerTx) close() {
	h.tx.db.mu.Lock()
	defer h.tx.db.mu.Unlock()
	h.closed = true
}
