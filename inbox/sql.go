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
// [SQL.Table] says) and its index, valid on PostgreSQL and SQLite, for
// migration tools. [SQL.Migrate] runs them.
func (s *SQL) Schema() (string, error) {
	t, err := s.table()
	if err != nil {
		return "", err
	}
	return schemaFor(t), nil
}

func schemaFor(t string) string {
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    consumer     text   NOT NULL, -- the consumer (group), and the id space: see StoredConsumer
    id           text   NOT NULL, -- the message id, as StoredID gives it
    processed_at bigint NOT NULL, -- Unix microseconds by the database's clock, for Prune
    PRIMARY KEY (consumer, id)
);
CREATE INDEX IF NOT EXISTS ` + t + `_processed_at ON ` + t + ` (processed_at);
`
}

// Migrate creates the inbox table and its index if they do not exist. It
// is idempotent. Two processes migrating a new PostgreSQL database at the
// same instant may see one of them fail with a unique violation in the
// catalog (PostgreSQL's CREATE ... IF NOT EXISTS is not atomic); run it
// once at deployment, or retry.
func (s *SQL) Migrate(ctx context.Context) error {
	if s.DB == nil {
		return errors.New("inbox: migrate: SQL.DB is nil")
	}
	t, err := s.table()
	if err != nil {
		return err
	}
	for _, stmt := range strings.Split(schemaFor(t), ";\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := s.DB.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: migrate: %w", err)
		}
	}
	return nil
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
// anything runs. An empty batch does nothing.
func (s *SQL) ProcessBatch(ctx context.Context, consumer string, ids []string, fn func(ctx context.Context, tx *sql.Tx, i int) error) (results []Result, err error) {
	if err := checkConsumer(consumer); err != nil {
		return nil, err
	}
	return s.processBatch(ctx, consumer, ids, fn)
}

// processBatch is ProcessBatch for a consumer column already checked (and
// maybe scoped by an id space, see StoredConsumer).
func (s *SQL) processBatch(ctx context.Context, consumer string, ids []string, fn func(ctx context.Context, tx *sql.Tx, i int) error) (results []Result, err error) {
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
	fresh, err := s.recordIDs(ctx, tx, engine, t, consumer, stored, distinct)
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
// only from 3.35). Several distinct ids are inserted plainly first, unless
// the driver's unique violations proved unreadable: errRecordedBefore or
// errUnreadable, with tx aborted, say to ask again with insertReturning in
// a new transaction.
func (s *SQL) recordIDs(ctx context.Context, tx *sql.Tx, engine int32, table, consumer string, ids, distinct []string) (map[string]bool, error) {
	if len(ids) == 1 {
		r, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (consumer, id, processed_at) VALUES ($1, $2, "+nowMicros(engine)+") ON CONFLICT DO NOTHING", consumer, ids[0])
		if err != nil {
			return nil, err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return nil, err
		}
		return map[string]bool{ids[0]: n == 1}, nil
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

// insertReturning records ids, sorted and distinct (sortedDistinct), with
// ON CONFLICT DO NOTHING RETURNING id, which lists only the rows this
// statement inserted: a row another transaction inserted, committed or
// not, is not new (the statement waits for that transaction to end
// first).
func insertReturning(ctx context.Context, tx *sql.Tx, engine int32, table, consumer string, ids []string) (map[string]bool, error) {
	fresh := make(map[string]bool, len(ids))
	err := insertRows(ids, engine, table, " ON CONFLICT DO NOTHING RETURNING id", consumer,
		func(q string, args []any) error {
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
				fresh[id] = true
			}
			if err := rows.Err(); err != nil {
				return err
			}
			return rows.Close()
		})
	if err != nil {
		return nil, err
	}
	return fresh, nil
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
		q.WriteString("INSERT INTO " + table + " (consumer, id, processed_at) SELECT $1, column1, " + nowMicros(engine) + " FROM (VALUES ")
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
		_, err = s.processBatch(ctx, c, []string{m.ID}, func(ctx context.Context, tx *sql.Tx, _ int) error {
			return fn(ctx, tx, m)
		})
		return err
	}
}

// Prune deletes the ids processed more than olderThan ago, by the
// database's clock, a thousand rows per statement so that it never holds
// many locks at once, and returns how many it deleted. A redelivery of a
// pruned id runs its effect again, so olderThan must be at least
// [SQL.MinRetention] (else [ErrRetention], and nothing is deleted): see
// Retention in the package documentation for how long to keep ids.
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
	engine, err := s.engineOf(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: prune: %w", err)
	}
	// Row values (consumer, id) IN (...) are in PostgreSQL and SQLite
	// 3.15+; neither has a portable DELETE ... LIMIT.
	q := "DELETE FROM " + t + " WHERE (consumer, id) IN (SELECT consumer, id FROM " + t +
		" WHERE processed_at < " + nowMicros(engine) + " - $1 LIMIT 1000)"
	var total int64
	for {
		r, err := s.DB.ExecContext(ctx, q, olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		n, err := r.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("inbox: prune: %w", err)
		}
		total += n
		if n < 1000 {
			return total, nil
		}
	}
}
