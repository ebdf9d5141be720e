package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultTable is the inbox table's name when [SQL.Table] is empty.
const DefaultTable = "idemhttp_inbox"

// maxBatchRows bounds the rows of one multi-row INSERT, well under
// SQLite's 32766 and PostgreSQL's 65535 bind parameters.
const maxBatchRows = 500

// SQL is the inbox in a table of a PostgreSQL or SQLite (3.24 or later)
// database reached through database/sql: any driver for either engine
// works (pgx's stdlib, lib/pq, modernc.org/sqlite, mattn/go-sqlite3). The
// table must be in the same database as the consumer's business tables,
// since the point is one transaction for both.
//
// The statements use only what both engines share: $n placeholders, INSERT
// ... ON CONFLICT DO NOTHING, and processed_at as an integer (Unix
// microseconds from the consumer's clock, used only by [SQL.Prune]).
//
// On SQLite, open the database so that a transaction takes the write lock
// when it begins and waits for it (contrib/sqlite's Open does): otherwise
// concurrent consumers get SQLITE_BUSY instead of waiting.
//
// The zero value is not usable: DB must be set. A SQL is safe for
// concurrent use; its fields must not change once it is in use.
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
    consumer     text   NOT NULL, -- the consumer (group) that processed the message
    id           text   NOT NULL, -- the message id, as StoredID gives it
    processed_at bigint NOT NULL, -- Unix microseconds, for Prune
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
// cases nothing runs.
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
// concurrent batches sharing ids cannot deadlock), calls fn(ctx, tx, i) for
// each message i whose id is new, in order, and commits once. The results
// are in the order of ids; a message whose id appears earlier in the same
// batch is a duplicate.
//
// The batch commits or rolls back as a whole: when fn returns an error for
// any message, nothing of the batch is recorded and ProcessBatch returns
// that error, so the whole batch must be redelivered (a message that must
// be skipped instead should be handled, e.g. recorded as dead, by fn
// itself and fn return nil). Any empty id gives [ErrNoMessageID] before
// anything runs. An empty batch does nothing.
func (s *SQL) ProcessBatch(ctx context.Context, consumer string, ids []string, fn func(ctx context.Context, tx *sql.Tx, i int) error) (results []Result, err error) {
	if s.DB == nil {
		return nil, errors.New("inbox: SQL.DB is nil")
	}
	if err := checkConsumer(consumer); err != nil {
		return nil, err
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

	tx, err := s.DB.BeginTx(ctx, s.TxOptions)
	if err != nil {
		return nil, fmt.Errorf("inbox: begin: %w", err)
	}
	committed := false
	defer func() {
		// Also on a panic in fn: the id must not stay recorded without
		// its effect. The rollback's own error adds nothing to the one
		// being returned.
		if !committed {
			_ = tx.Rollback()
		}
	}()

	fresh, err := insertIDs(ctx, tx, t, consumer, stored, time.Now().UnixMicro())
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

// insertIDs records ids and returns the set of those that were new. The
// INSERT ... ON CONFLICT DO NOTHING is what makes the inbox safe: a
// concurrent transaction inserting the same key waits for this one, and
// RETURNING lists only the rows this statement inserted. A single id uses
// the rows-affected count instead of RETURNING, which SQLite has only from
// 3.35.
func insertIDs(ctx context.Context, tx *sql.Tx, table, consumer string, ids []string, now int64) (map[string]bool, error) {
	fresh := make(map[string]bool, len(ids))
	if len(ids) == 1 {
		r, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (consumer, id, processed_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", consumer, ids[0], now)
		if err != nil {
			return nil, err
		}
		n, err := r.RowsAffected()
		if err != nil {
			return nil, err
		}
		if n == 1 {
			fresh[ids[0]] = true
		}
		return fresh, nil
	}
	// Sorted, so that two batches sharing ids lock their rows in the same
	// order and wait for each other instead of deadlocking.
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for start := 0; start < len(ids); start += maxBatchRows {
		chunk := ids[start:min(start+maxBatchRows, len(ids))]
		var q strings.Builder
		q.WriteString("INSERT INTO " + table + " (consumer, id, processed_at) VALUES ")
		args := make([]any, 0, len(chunk)+2)
		args = append(args, consumer, now)
		for i, id := range chunk {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("($1, $" + strconv.Itoa(i+3) + ", $2)")
			args = append(args, id)
		}
		q.WriteString(" ON CONFLICT DO NOTHING RETURNING id")
		rows, err := tx.QueryContext(ctx, q.String(), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			fresh[id] = true
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
	}
	return fresh, nil
}

// Handle returns a [Handler] that processes each message with
// [SQL.Process] as consumer: fn runs, with the transaction, only for a
// message whose id is new, and a duplicate returns nil so the adapter acks
// it. A message without an id returns [ErrNoMessageID] and runs nothing.
func (s *SQL) Handle(consumer string, fn func(ctx context.Context, tx *sql.Tx, m *Message) error) Handler {
	return func(ctx context.Context, m *Message) error {
		_, err := s.Process(ctx, consumer, m.ID, func(ctx context.Context, tx *sql.Tx) error {
			return fn(ctx, tx, m)
		})
		return err
	}
}

// Prune deletes the ids processed more than olderThan ago (by the
// consumers' clocks), a thousand rows per statement so that it never holds
// many locks at once, and returns how many it deleted. A redelivery of a
// pruned id runs its effect again: see Retention in the package
// documentation for how long to keep ids. olderThan must be positive.
func (s *SQL) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	if s.DB == nil {
		return 0, errors.New("inbox: prune: SQL.DB is nil")
	}
	if olderThan <= 0 {
		return 0, fmt.Errorf("inbox: prune: olderThan must be positive, got %v", olderThan)
	}
	t, err := s.table()
	if err != nil {
		return 0, err
	}
	cutoff := time.Now().Add(-olderThan).UnixMicro()
	// Row values (consumer, id) IN (...) are in PostgreSQL and SQLite
	// 3.15+; neither has a portable DELETE ... LIMIT.
	q := "DELETE FROM " + t + " WHERE (consumer, id) IN (SELECT consumer, id FROM " + t + " WHERE processed_at < $1 LIMIT 1000)"
	var total int64
	for {
		r, err := s.DB.ExecContext(ctx, q, cutoff)
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
