package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// DefaultTable is the inbox table's name when [SQL.Table] is empty.
const DefaultTable = "idemhttp_inbox"

// maxBatchRows bounds the rows of one multi-row INSERT, well under
// SQLite's 32766 and PostgreSQL's 65535 bind parameters.
const maxBatchRows = 500

// DefaultMinRetention is [SQL.MinRetention] when zero: 15 days, the
// longest an SQS queue keeps a message (14 days) plus its longest
// visibility timeout (12 hours), with a margin. It covers the redelivery
// window of most setups, not all: RabbitMQ, a Kafka topic of long
// retention or a NATS stream without MaxAge can redeliver later. See
// Retention in the package documentation.
const DefaultMinRetention = 15 * 24 * time.Hour

// ErrRetention: [SQL.Prune] was asked to delete ids younger than the
// minimum retention, ids the broker may still redeliver.
var ErrRetention = errors.New("inbox: prune: retention shorter than the minimum")

// SQL is the inbox in a table of a PostgreSQL or SQLite (3.24 or later)
// database reached through database/sql: any driver for either engine
// works (pgx's stdlib, lib/pq, modernc.org/sqlite, mattn/go-sqlite3). The
// table must be in the same database as the consumer's business tables,
// since the point is one transaction for both.
//
// The statements use what both engines share ($n placeholders, INSERT
// ... ON CONFLICT DO NOTHING, processed_at as an integer of Unix
// microseconds) and each engine's own spelling of its clock: SQL asks the
// database once which engine it is. processed_at comes from the
// database's clock, and so does [SQL.Prune]'s cutoff, so that consumers
// whose clocks disagree cannot make Prune delete ids early.
//
// A batch of new ids is recorded with a plain multi-row INSERT, which
// PostgreSQL runs faster than one with ON CONFLICT (no speculative
// insertion per row). When some id was recorded before, that insert fails
// with a unique violation and the batch starts again with ON CONFLICT DO
// NOTHING RETURNING id, which says which. The violation is recognised by
// the driver's error: one with a SQLState method returning 23505 (pgx's
// stdlib, lib/pq), or with a Code method returning
// SQLITE_CONSTRAINT_PRIMARYKEY or SQLITE_CONSTRAINT_UNIQUE
// (modernc.org/sqlite): see [IsUniqueViolation]. With a driver whose
// errors say neither, the first batch that meets a recorded id finds out,
// and the SQL uses ON CONFLICT alone from then on.
//
// When the context of [SQL.Process] or [SQL.ProcessBatch] has a deadline
// (an adapter's processing limit), SQL sets PostgreSQL's
// statement_timeout, lock_timeout and idle_in_transaction_session_timeout
// for the transaction to the time left: the server itself then rolls the
// transaction back, releasing the id's row lock for a redelivery, when a
// hung handler overruns the deadline, even one that ignores its context.
// On SQLite the bound is database/sql's rollback when the context ends.
//
// On SQLite, open the database so that a transaction takes the write lock
// when it begins and waits for it (contrib/sqlite's Open does): otherwise
// concurrent consumers get SQLITE_BUSY instead of waiting.
//
// The zero value is not usable: DB must be set. A SQL is safe for
// concurrent use; its fields must not change once it is in use, and it
// must not be copied after first use.
type SQL struct {
	// DB is the database holding the inbox table and the business tables.
	DB *sql.DB

	// Table is the inbox table's name, a plain identifier (letters, digits
	// and underscores, not starting with a digit); empty means
	// [DefaultTable]. To put it in another schema, set the connection's
	// search_path (PostgreSQL) rather than qualifying the name.
	Table string

	// TxOptions are the options of the transactions Process and
	// ProcessBatch begin; nil means the driver's defaults (READ COMMITTED
	// on PostgreSQL, which is all the inbox needs: the primary key, not the
	// isolation level, serialises two deliveries of one id).
	TxOptions *sql.TxOptions

	// MinRetention is the youngest age of the ids [SQL.Prune] may delete:
	// it refuses a shorter olderThan with [ErrRetention]. Zero means
	// [DefaultMinRetention]. Set it to the longest time the broker can
	// redeliver a message after its effect committed: see Retention in the
	// package documentation for each broker's.
	MinRetention time.Duration

	engine      atomic.Int32 // one of the engine constants, once known
	pessimistic atomic.Bool  // the driver's unique violations are not recognised
}

// The engines SQL speaks to.
const (
	engineUnknown int32 = iota
	enginePostgres
	engineSQLite
)

// engineOf returns the engine of s.DB, asking the database the first
// time: only PostgreSQL has current_setting, and only SQLite
// sqlite_version. An error (a database that is down) is returned, and
// the next call asks again.
func (s *SQL) engineOf(ctx context.Context) (int32, error) {
	if e := s.engine.Load(); e != engineUnknown {
		return e, nil
	}
	var v string
	errPG := s.DB.QueryRowContext(ctx, "SELECT current_setting('server_version_num')").Scan(&v)
	if errPG == nil {
		s.engine.Store(enginePostgres)
		return enginePostgres, nil
	}
	errSQLite := s.DB.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v)
	if errSQLite == nil {
		s.engine.Store(engineSQLite)
		return engineSQLite, nil
	}
	return engineUnknown, fmt.Errorf("inbox: the database is neither PostgreSQL nor SQLite, or is unreachable: %w", errors.Join(errPG, errSQLite))
}

// nowMicros is the engine's clock in Unix microseconds, as an SQL
// expression. PostgreSQL's now() is the transaction's start, one value
// for a whole batch; SQLite's 'now' is one value per statement.
func nowMicros(engine int32) string {
	if engine == enginePostgres {
		return "(extract(epoch from now()) * 1000000)::bigint"
	}
	return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
}

func (s *SQL) table() (string, error) {
	t := s.Table
	if t == "" {
		t = DefaultTable
	}
	if !isIdentifier(t) {
		return "", fmt.Errorf("%w: %q", ErrInvalidTable, t)
	}
	return t, nil
}

func isIdentifier(s string) bool {
	if s == "" || len(s) > 63 { // PostgreSQL truncates names past 63 bytes
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// Schema returns the statements that create the inbox table (named as
// [SQL.Table] says), its index and its ledger table ([SQL.Ledger]), valid
// on PostgreSQL and SQLite, for migration tools that manage the schema
// themselves. A table created by the previous release (with no format
// column) also needs
//
//	ALTER TABLE <table> ADD COLUMN format smallint NOT NULL DEFAULT 1;
//
// which [SQL.Migrate] runs when the column is missing. See Formats and
// upgrades in the package documentation.
func (s *SQL) Schema() (string, error) {
	t, err := s.table()
	if err != nil {
		return "", err
	}
	l, err := ledgerTable(t)
	if err != nil {
		return "", err
	}
	return schemaFor(t, l), nil
}

// The formats of the inbox's rows: the format column of each row says
// which release wrote it, and why. A row of the previous release, which
// had no column, and a row an instance of it writes during a rolling
// deploy, take the column's default, 1.
const (
	// formatLegacy (1): written by the previous release, which recorded
	// every message of a consumer in one id space: (consumer, id).
	formatLegacy = 1
	// formatOwn (2): this release's record of a message in its own id
	// space: (StoredConsumer(consumer, space), id), which for a message
	// with no id space is (consumer, id).
	formatOwn = 2
	// formatCopy (3): this release's copy, under the consumer's plain
	// name, of its record of a message with an id space: an instance of
	// the previous release running beside it in a rolling deploy looks
	// there, sees the message as processed, and waits on that row while
	// this release processes it. It says nothing to this release about
	// any id space; a message with no id space whose row it occupies
	// takes it over (format 2).
	formatCopy = 3
	// formatDeadLettered (4): a tombstone, written by the ledger's
	// OpTombstone before a dead letter (see [OpTombstone]): the message
	// is not processed, and its effect can no longer commit (an effect's
	// insert of the id conflicts with it). The previous release reads it
	// as processed. [SQLLedger.Redrive] deletes it; [SQL.Prune] too, in
	// its time.
	formatDeadLettered = 4
)

// ledgerFormat is the format of the ledger's rows (format column).
const ledgerFormat = 1

func schemaFor(t, l string) string {
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer     text     NOT NULL, -- the consumer (group), and the id space: see StoredConsumer
    id           text     NOT NULL, -- the message id, as StoredID gives it
    processed_at bigint   NOT NULL, -- Unix microseconds by the database's clock, for Prune
    format       smallint NOT NULL DEFAULT 1, -- 1: the previous release's row; 2: this one's; 3: this one's copy for the previous; 4: a dead letter's tombstone
    PRIMARY KEY (consumer, id)
);
CREATE INDEX IF NOT EXISTS ` + t + `_processed_at ON ` + t + ` (processed_at);
CREATE TABLE IF NOT EXISTS ` + l + ` (
    consumer   text     NOT NULL, -- as in the inbox table
    id         text     NOT NULL, -- as in the inbox table
    failures   integer  NOT NULL DEFAULT 0, -- handler runs that failed
    running    integer  NOT NULL DEFAULT 0, -- handler runs begun and not ended
    updated_at bigint   NOT NULL, -- Unix microseconds by the database's clock, for Prune
    format     smallint NOT NULL DEFAULT 1, -- the row's format: 1
    PRIMARY KEY (consumer, id)
);
`
}

// Migrate creates the inbox table, its index and its ledger table if they
// do not exist, and upgrades an inbox table of the previous release in
// place (adding the format column, whose default marks its rows as that
// release's). It is idempotent. Two processes migrating a new PostgreSQL
// database at the same instant may see one of them fail with a unique
// violation in the catalog (PostgreSQL's CREATE ... IF NOT EXISTS is not
// atomic); run it once at deployment, or retry.
func (s *SQL) Migrate(ctx context.Context) error {
	if s.DB == nil {
		return errors.New("inbox: migrate: SQL.DB is nil")
	}
	t, err := s.table()
	if err != nil {
		return err
	}
	l, err := ledgerTable(t)
	if err != nil {
		return err
	}
	engine, err := s.engineOf(ctx)
	if err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	for _, stmt := range strings.Split(schemaFor(t, l), ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := s.DB.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: migrate: %w", err)
		}
	}
	if err := addFormatColumn(ctx, s.DB, engine, t); err != nil {
		return fmt.Errorf("inbox: migrate: upgrade %s: %w", t, err)
	}
	return nil
}

// addFormatColumn adds the format column to the table t of the previous
// release, when it lacks one. Its default, 1, marks the rows already
// there as that release's, and the rows an instance of it writes during a
// rolling deploy. PostgreSQL adds it without rewriting the table.
func addFormatColumn(ctx context.Context, db *sql.DB, engine int32, t string) error {
	// Look first: ALTER TABLE takes the table's strongest lock even when it
	// has nothing to do, and every instance migrates at start-up.
	q := "SELECT count(*) FROM pragma_table_info($1) WHERE name = 'format'"
	if engine == enginePostgres {
		// to_regclass resolves t on the search_path, as the statements do.
		q = "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'format' AND NOT attisdropped"
	}
	var n int
	if err := db.QueryRowContext(ctx, q, t).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	// PostgreSQL adds a column with a constant default without rewriting
	// the table; IF NOT EXISTS covers a concurrent Migrate.
	stmt := "ALTER TABLE " + t + " ADD COLUMN format smallint NOT NULL DEFAULT 1"
	if engine == enginePostgres {
		stmt = "ALTER TABLE " + t + " ADD COLUMN IF NOT EXISTS format smallint NOT NULL DEFAULT 1"
	}
	_, err := db.ExecContext(ctx, stmt)
	return err
}

// ledgerTable is the name of the ledger table of the inbox table t.
func ledgerTable(t string) (string, error) {
	l := t + "_ledger"
	if !isIdentifier(l) {
		return "", fmt.Errorf("%w: %q (the ledger's table, %q, would pass 63 bytes)", ErrInvalidTable, t, l)
	}
	return l, nil
}

// Process runs fn exactly once for the message messageID of consumer, in a
// transaction that also records the id, and reports whether the message
// was a duplicate.
//
// In one transaction, Process inserts (consumer, [StoredID](messageID))
// with ON CONFLICT DO NOTHING. If the row is new, it calls fn with the
// transaction and commits when fn returns nil: the effect and the record
// commit together. If the row exists (a previous delivery committed), it
// rolls back, runs nothing, and returns Result{Duplicate: true} with a nil
// error: ack the message. A delivery of an id whose first delivery is
// still running waits on its row, and then is a duplicate (the first
// committed) or runs fn (the first rolled back).
//
// fn must do all its work through tx and must not commit or roll it back.
// When fn returns an error (or panics), the transaction rolls back, the id
// is not recorded, and Process returns fn's error unchanged (or panics
// again): do not ack, so that the redelivery runs fn again.
//
// Any other error means nothing is known to have committed: do not ack. An
// error from the commit itself leaves the outcome unknown, which is safe:
// if it did commit, the redelivery is a duplicate. An empty messageID gives
// [ErrNoMessageID], an invalid consumer [ErrInvalidConsumer], and in both
// cases nothing runs. When ctx has a deadline, the transaction does not
// outlive it (see [SQL]): what still runs then fails, and everything rolls
// back.
func (s *SQL) Process(ctx context.Context, consumer, messageID string, fn func(ctx context.Context, tx *sql.Tx) error) (Result, error) {
	res, err := s.ProcessBatch(ctx, consumer, []string{messageID}, func(ctx context.Context, tx *sql.Tx, _ int) error {
		return fn(ctx, tx)
	})
	if err != nil {
		return Result{}, err
	}
	return res[0], nil
}

// ProcessBatch is [SQL.Process] for many messages of one consumer in one
// transaction, for consumers that commit many messages at once: it records
// every id of ids with one statement per 500 ids (in sorted order, so that
// concurrent batches sharing ids cannot deadlock; two when some id was
// processed before), calls fn(ctx, tx, i) for each message i whose id is
// new, in order, and commits once. The results are in the order of ids; a
// message whose id appears earlier in the same batch is a duplicate.
//
// The batch commits or rolls back as a whole: when fn returns an error for
// any message, nothing of the batch is recorded and ProcessBatch returns
// that error, so the whole batch must be redelivered (a message that must
// be skipped instead should be handled, e.g. recorded as dead, by fn
// itself and fn return nil). Any empty id gives [ErrNoMessageID] before
// anything runs. An empty batch does nothing. A message that was
// dead-lettered (its tombstone, see [OpTombstone]: its dead letter may
// have failed, and the message come back) fails the batch before anything
// runs, with an error wrapping [ErrDeadLettered] that names it: dead-letter
// that message again (the message core does, through Process) and
// redeliver the rest; never ack it as a duplicate.
func (s *SQL) ProcessBatch(ctx context.Context, consumer string, ids []string, fn func(ctx context.Context, tx *sql.Tx, i int) error) (results []Result, err error) {
	if err := checkConsumer(consumer); err != nil {
		return nil, err
	}
	return s.processBatch(ctx, consumer, consumer, ids, fn)
}

// processBatch is ProcessBatch for a consumer column already checked (and
// maybe scoped by an id space, see StoredConsumer); legacy is the
// consumer's plain name, under which the previous release recorded every
// id of the consumer (equal to consumer when there is no id space).
func (s *SQL) processBatch(ctx context.Context, consumer, legacy string, ids []string, fn func(ctx context.Context, tx *sql.Tx, i int) error) (results []Result, err error) {
	if s.DB == nil {
		return nil, errors.New("inbox: SQL.DB is nil")
	}
	t, err := s.table()
	if err != nil {
		return nil, err
	}
	stored := make([]string, len(ids))
	for i, id := range ids {
		if id == "" {
			return nil, fmt.Errorf("%w (message %d of the batch)", ErrNoMessageID, i)
		}
		stored[i] = StoredID(id)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	engine, err := s.engineOf(ctx)
	if err != nil {
		return nil, err
	}
	// Sorted and without repeats once, for every insert below (a single
	// id is both already).
	distinct := stored
	if len(stored) > 1 {
		distinct = sortedDistinct(stored)
	}

	var tx *sql.Tx
	committed := false
	defer func() {
		// Also on a panic in fn: the id must not stay recorded without
		// its effect. The rollback's own error adds nothing to the one
		// being returned.
		if !committed && tx != nil {
			_ = tx.Rollback()
		}
	}()
	begin := func() error {
		var err error
		if tx, err = s.DB.BeginTx(ctx, s.TxOptions); err != nil {
			tx = nil
			return fmt.Errorf("inbox: begin: %w", err)
		}
		if err := limitTx(ctx, tx, engine); err != nil {
			return fmt.Errorf("inbox: set the transaction's timeouts: %w", err)
		}
		return nil
	}
	if err := begin(); err != nil {
		return nil, err
	}
	fresh, err := s.recordIDs(ctx, tx, engine, t, consumer, legacy, stored, distinct)
	if unreadable := errors.Is(err, errUnreadable); unreadable || errors.Is(err, errRecordedBefore) {
		// Some id of the batch was recorded before (typically a batch
		// redelivered after a crash), and the plain insert aborted the
		// transaction: start again, asking which. Nothing ran yet.
		_ = tx.Rollback()
		if err := begin(); err != nil {
			return nil, err
		}
		fresh, err = insertReturning(ctx, tx, engine, t, consumer, distinct)
		if err == nil && unreadable && len(fresh) < len(distinct) {
			// The plain insert's error was a unique violation that this
			// driver does not spell recognisably: from now on, ON
			// CONFLICT only, so that every redelivered batch does not
			// pay for two statements.
			s.pessimistic.Store(true)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: record ids: %w", err)
	}
	if err := batchTombstone(ctx, tx, t, consumer, ids, stored, fresh); err != nil {
		return nil, err
	}
	if plant.SplitDedup && len(fresh) > 0 { // a planted bug (internal/plant), false but in a test build
		if err := tx.Commit(); err != nil {
			return nil, fmt.Errorf("inbox: commit: %w", err)
		}
		if err := begin(); err != nil {
			return nil, err
		}
	}
	results = make([]Result, len(ids))
	ran := 0
	for i, id := range stored {
		if !fresh[id] {
			results[i].Duplicate = true
			continue
		}
		delete(fresh, id) // a later copy in this batch is a duplicate
		if err := fn(ctx, tx, i); err != nil {
			return nil, err
		}
		ran++
	}
	if ran == 0 {
		// Nothing new: nothing to commit. Rolling back releases the
		// same locks.
		return results, nil
	}
	if plant.AckFirst { // a planted bug (internal/plant), false but in a test build
		committed = true
		go func(tx *sql.Tx) { _ = tx.Commit() }(tx)
		return results, nil
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("inbox: commit (outcome unknown; a redelivery is safe): %w", err)
	}
	committed = true
	return results, nil
}

// limitTx bounds tx by ctx's deadline on PostgreSQL: each statement, each
// wait for a lock, and each pause between statements (a handler doing
// something else while it holds the transaction) ends when the deadline
// passes, on the server, whatever the client does meanwhile. Without a
// deadline it sends nothing.
func limitTx(ctx context.Context, tx *sql.Tx, engine int32) error {
	deadline, ok := ctx.Deadline()
	if !ok || engine != enginePostgres {
		return nil
	}
	left := time.Until(deadline)
	if left <= 0 {
		return context.DeadlineExceeded
	}
	// PostgreSQL reads 0 as "no limit": never less than a millisecond.
	ms := strconv.FormatInt(max(left.Milliseconds(), 1), 10) + "ms"
	_, err := tx.ExecContext(ctx, "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true)", ms)
	return err
}

// errRecordedBefore: the plain insert of a batch met an id recorded
// before; the transaction is aborted. errUnreadable: it failed in a way
// the driver does not let us read.
var (
	errRecordedBefore = errors.New("an id of the batch was recorded before")
	errUnreadable     = errors.New("the batch's insert failed")
)

// recordIDs records ids (stored forms; distinct is sortedDistinct(ids))
// in tx and returns the set of those that were new. A single id uses ON
// CONFLICT DO NOTHING and the rows-affected count (RETURNING is in SQLite
// only from 3.35), and, when legacy differs from consumer, records the
// legacy row too (see recordOne). Several distinct ids (always of a
// consumer without an id space) are inserted plainly first, unless the
// driver's unique violations proved unreadable: errRecordedBefore or
// errUnreadable, with tx aborted, say to ask again with insertReturning in
// a new transaction.
func (s *SQL) recordIDs(ctx context.Context, tx *sql.Tx, engine int32, table, consumer, legacy string, ids, distinct []string) (map[string]bool, error) {
	if len(ids) == 1 {
		fresh, err := recordOne(ctx, tx, engine, table, consumer, legacy, ids[0])
		if err != nil {
			return nil, err
		}
		return map[string]bool{ids[0]: fresh}, nil
	}
	if len(distinct) == 1 || s.pessimistic.Load() {
		return insertReturning(ctx, tx, engine, table, consumer, distinct)
	}
	err := insertRows(distinct, engine, table, "", consumer,
		func(q string, args []any) error {
			_, err := tx.ExecContext(ctx, q, args...)
			return err
		})
	switch {
	case err == nil:
		fresh := make(map[string]bool, len(distinct))
		for _, id := range distinct {
			fresh[id] = true
		}
		return fresh, nil
	case IsUniqueViolation(err):
		return nil, errRecordedBefore
	case ctx.Err() != nil:
		return nil, err
	}
	// An error the driver does not let us read: a unique violation, or
	// something else. Asking again the portable way, in a new
	// transaction, is right either way.
	return nil, fmt.Errorf("%w: %w", errUnreadable, err)
}

// insertOne records the id in tx under consumer in the given format, and
// reports whether the row is new.
func insertOne(ctx context.Context, tx *sql.Tx, engine int32, table, consumer, id string, format int) (bool, error) {
	r, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (consumer, id, processed_at, format) VALUES ($1, $2, "+nowMicros(engine)+", "+strconv.Itoa(format)+") ON CONFLICT DO NOTHING", consumer, id)
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n == 1, err
}

// readFormat reads the format of the row (consumer, id), in a statement
// of its own: it sees a row another transaction committed while an insert
// of tx waited for it.
func readFormat(ctx context.Context, tx *sql.Tx, table, consumer, id string) (int, error) {
	var format int
	err := tx.QueryRowContext(ctx, "SELECT format FROM "+table+" WHERE consumer = $1 AND id = $2", consumer, id).Scan(&format)
	return format, err
}

// batchTombstone fails a batch of several ids when one of those recorded
// before holds a dead letter's tombstone (formatDeadLettered, see
// [OpTombstone]), before anything of the batch runs, with an error
// wrapping [ErrDeadLettered] that names the message: its dead letter may
// have failed (the message was requeued, the tombstone stays), and
// answering it Duplicate would have it acked, neither processed nor
// dead-lettered. A batch of one reads its tombstone in recordOne.
func batchTombstone(ctx context.Context, tx *sql.Tx, table, consumer string, ids, stored []string, fresh map[string]bool) error {
	if len(stored) < 2 || plant.BatchNoTombstone { // a planted bug (internal/plant), false but in a test build
		return nil
	}
	var seen []string
	for _, id := range stored {
		if !fresh[id] {
			seen = append(seen, id)
		}
	}
	for len(seen) > 0 {
		chunk := seen[:min(len(seen), 500)]
		seen = seen[len(chunk):]
		var q strings.Builder
		q.WriteString("SELECT id FROM " + table + " WHERE consumer = $1 AND format = " + strconv.Itoa(formatDeadLettered) + " AND id IN (")
		args := make([]any, 0, len(chunk)+1)
		args = append(args, consumer)
		for i, id := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("$" + strconv.Itoa(i+2))
			args = append(args, id)
		}
		q.WriteString(") LIMIT 1")
		var id string
		switch err := tx.QueryRowContext(ctx, q.String(), args...).Scan(&id); {
		case errors.Is(err, sql.ErrNoRows):
			continue
		case err != nil:
			return fmt.Errorf("inbox: read tombstones: %w", err)
		}
		for i, s := range stored {
			if s == id {
				return fmt.Errorf("inbox: message %d of the batch (%q): %w", i, ids[i], ErrDeadLettered)
			}
		}
		return fmt.Errorf("inbox: a message of the batch: %w", ErrDeadLettered)
	}
	return nil
}

// recordOne records one message's id (its stored form) under consumer in
// tx and reports whether the message is new (see the format constants):
//
//   - With an id space (legacy, the consumer's plain name, differs from
//     consumer), it also records the copy (legacy, id) that an instance of
//     the previous release reads, and that one processing the message at
//     the same moment waits on, as this insert waits on its. The message
//     is a duplicate when its own row was there, or when the legacy row
//     was there in the previous release's format (written by it, before
//     the upgrade or by an old instance now).
//   - Without one, its row is the legacy row: a row of the previous
//     release or its own makes it a duplicate; another id space's copy is
//     taken over.
//
// A tombstone in its own row (the message was dead-lettered, see
// [OpTombstone]) gives [ErrDeadLettered]: nothing runs, and the core
// dead-letters the delivery again.
func recordOne(ctx context.Context, tx *sql.Tx, engine int32, table, consumer, legacy, id string) (bool, error) {
	fresh, err := insertOne(ctx, tx, engine, table, consumer, id, formatOwn)
	if err != nil {
		return false, err
	}
	if legacy != consumer {
		if !fresh {
			// A duplicate, or a dead letter's tombstone.
			format, err := readFormat(ctx, tx, table, consumer, id)
			if err == nil && format == formatDeadLettered {
				return false, ErrDeadLettered
			}
			return false, err
		}
		if fresh, err = insertOne(ctx, tx, engine, table, legacy, id, formatCopy); err != nil || fresh {
			return fresh, err
		}
		format, err := readFormat(ctx, tx, table, legacy, id)
		return format != formatLegacy, err
	}
	if fresh {
		return true, nil
	}
	format, err := readFormat(ctx, tx, table, consumer, id)
	if err != nil || format != formatCopy {
		if err == nil && format == formatDeadLettered {
			return false, ErrDeadLettered
		}
		return false, err
	}
	return claimCopy(ctx, tx, engine, table, consumer, id)
}

// claimCopy makes another id space's copy (consumer, id) the record of
// the message with no id space and that id, and reports whether it did:
// false when a concurrent delivery of that message took it first.
func claimCopy(ctx context.Context, tx *sql.Tx, engine int32, table, consumer, id string) (bool, error) {
	r, err := tx.ExecContext(ctx, "UPDATE "+table+" SET format = "+strconv.Itoa(formatOwn)+", processed_at = "+nowMicros(engine)+
		" WHERE consumer = $1 AND id = $2 AND format = "+strconv.Itoa(formatCopy), consumer, id)
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n == 1, err
}

// insertReturning records ids, sorted and distinct (sortedDistinct), with
// ON CONFLICT DO NOTHING RETURNING id, which lists only the rows this
// statement inserted: a row another transaction inserted, committed or
// not, is not new (the statement waits for that transaction to end
// first).
func insertReturning(ctx context.Context, tx *sql.Tx, engine int32, table, consumer string, ids []string) (map[string]bool, error) {
	fresh := make(map[string]bool, len(ids))
	err := insertRows(ids, engine, table, " ON CONFLICT DO NOTHING RETURNING id", consumer,
		func(q string, args []any) error { return collectIDs(ctx, tx, q, args, fresh) })
	if err != nil {
		return nil, err
	}
	if len(fresh) == len(ids) {
		return fresh, nil
	}
	// The others were there: the previous release's rows and this one's
	// are duplicates; another id space's copies are taken over.
	var taken []string
	for _, id := range ids {
		if !fresh[id] {
			taken = append(taken, id)
		}
	}
	for start := 0; start < len(taken); start += maxBatchRows {
		chunk := taken[start:min(start+maxBatchRows, len(taken))]
		var q strings.Builder
		q.WriteString("UPDATE " + table + " SET format = " + strconv.Itoa(formatOwn) + ", processed_at = " + nowMicros(engine) +
			" WHERE consumer = $1 AND format = " + strconv.Itoa(formatCopy) + " AND id IN (")
		args := make([]any, 0, len(chunk)+1)
		args = append(args, consumer)
		for i, id := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("$" + strconv.Itoa(i+2))
			args = append(args, id)
		}
		q.WriteString(") RETURNING id")
		if err := collectIDs(ctx, tx, q.String(), args, fresh); err != nil {
			return nil, err
		}
	}
	return fresh, nil
}

// collectIDs runs the query q, which returns ids, in tx and adds them to
// set.
func collectIDs(ctx context.Context, tx *sql.Tx, q string, args []any, set map[string]bool) error {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		set[id] = true
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// sortedDistinct returns ids sorted, without repeats: sorted, so that two
// batches sharing ids lock their rows in the same order and wait for each
// other instead of deadlocking.
func sortedDistinct(ids []string) []string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return slices.Compact(ids)
}

// insertRows runs, through run, one INSERT per maxBatchRows of ids into
// table, each row (consumer, id, the engine's clock), followed by suffix.
// The ids are a VALUES list read by a SELECT, so that the clock's
// expression is written once per statement, not once per row. (SQLite
// needs the WHERE to read ON CONFLICT as the upsert's, not a join's.)
func insertRows(ids []string, engine int32, table, suffix, consumer string, run func(q string, args []any) error) error {
	for start := 0; start < len(ids); start += maxBatchRows {
		chunk := ids[start:min(start+maxBatchRows, len(ids))]
		var q strings.Builder
		q.Grow(120 + 6*len(chunk) + len(suffix))
		q.WriteString("INSERT INTO " + table + " (consumer, id, processed_at, format) SELECT $1, column1, " + nowMicros(engine) + ", " + strconv.Itoa(formatOwn) + " FROM (VALUES ")
		args := make([]any, 0, len(chunk)+1)
		args = append(args, consumer)
		for i, id := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("($" + strconv.Itoa(i+2) + ")")
			args = append(args, id)
		}
		q.WriteString(") AS ids WHERE true")
		q.WriteString(suffix)
		if err := run(q.String(), args); err != nil {
			return err
		}
	}
	return nil
}

// IsUniqueViolation reports whether err, or an error it wraps, is a
// database driver's unique violation: SQLSTATE 23505 from an error with a
// SQLState() string method (pgx and its database/sql driver, lib/pq), or
// SQLITE_CONSTRAINT_PRIMARYKEY (1555) or SQLITE_CONSTRAINT_UNIQUE (2067)
// from one with a Code() int method (modernc.org/sqlite). It is false for
// every other error, including a unique violation of a driver whose
// errors have neither method (mattn/go-sqlite3). Interfaces, not the
// drivers' types, keep this package free of every driver.
func IsUniqueViolation(err error) bool {
	var pg interface{ SQLState() string }
	if errors.As(err, &pg) {
		return pg.SQLState() == "23505"
	}
	var lite interface{ Code() int }
	if errors.As(err, &lite) {
		c := lite.Code()
		return c == 1555 || c == 2067
	}
	return false
}

// Handle returns a [Handler] that processes each message with
// [SQL.Process] as consumer, in the message's id space: its row is
// recorded under [StoredConsumer](consumer, m.IDSpace), so two sources
// whose ids overlap never take each other's messages for duplicates
// (unless their adapters declare one shared id space). fn runs, with the
// transaction, only for a message whose id is new, and a duplicate
// returns nil so the adapter acks it. A message without an id returns
// [ErrNoMessageID] and runs nothing; an invalid consumer,
// [ErrInvalidConsumer].
func (s *SQL) Handle(consumer string, fn func(ctx context.Context, tx *sql.Tx, m *Message) error) Handler {
	return func(ctx context.Context, m *Message) error {
		c, err := StoredConsumer(consumer, m.IDSpace)
		if err != nil {
			return err
		}
		if plant.DropSpace { // a planted bug (internal/plant), false but in a test build
			c = consumer
		}
		_, err = s.processBatch(ctx, c, consumer, []string{m.ID}, func(ctx context.Context, tx *sql.Tx, _ int) error {
			return fn(ctx, tx, m)
		})
		return err
	}
}

// Prune deletes the ids processed more than olderThan ago, by the
// database's clock, a thousand rows per statement so that it never holds
// many locks at once, and returns how many it deleted. It deletes the
// ledger's records ([SQL.Ledger]) untouched for as long too (a message
// that fails is touched at each failure), and does not count them. A
// redelivery of a pruned id runs its effect again, so olderThan must be at
// least [SQL.MinRetention] (else [ErrRetention], and nothing is deleted):
// see Retention in the package documentation for how long to keep ids.
func (s *SQL) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if s.DB == nil {
		return 0, errors.New("inbox: prune: SQL.DB is nil")
	}
	minimum := s.MinRetention
	if minimum <= 0 {
		minimum = DefaultMinRetention
	}
	if olderThan < minimum {
		return 0, fmt.Errorf("%w: %v is under %v (SQL.MinRetention)", ErrRetention, olderThan, minimum)
	}
	t, err := s.table()
	if err != nil {
		return 0, err
	}
	l, err := ledgerTable(t)
	if err != nil {
		return 0, err
	}
	engine, err := s.engineOf(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: prune: %w", err)
	}
	total, err := s.prune(ctx, engine, t, "processed_at", olderThan)
	if err != nil {
		return total, err
	}
	if _, err := s.prune(ctx, engine, l, "updated_at", olderThan); err != nil {
		return total, err
	}
	return total, nil
}

// prune deletes the rows of table whose column (Unix microseconds) is
// older than olderThan by the database's clock, a thousand at a time.
func (s *SQL) prune(ctx context.Context, engine int32, table, column string, olderThan time.Duration) (int64, error) {
	// Row values (consumer, id) IN (...) are in PostgreSQL and SQLite
	// 3.15+; neither has a portable DELETE ... LIMIT.
	q := "DELETE FROM " + table + " WHERE (consumer, id) IN (SELECT consumer, id FROM " + table +
		" WHERE " + column + " < " + nowMicros(engine) + " - $1 LIMIT 1000)"
	var total int64
	age := olderThan.Microseconds()
	if plant.PruneMillis { // a planted bug (internal/plant), false but in a test build
		age = olderThan.Milliseconds()
	}
	for {
		r, err := s.DB.ExecContext(ctx, q, age)
		if err != nil {
			return total, fmt.Errorf("inbox: prune %s: %w", table, err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("inbox: prune %s: %w", table, err)
		}
		total += n
		if n < 1000 {
			return total, nil
		}
	}
}
