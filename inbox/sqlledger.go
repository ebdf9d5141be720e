package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemkit/idemhttp/internal/plant"
)

// SQLLedger is the [Ledger] of an [SQL] inbox for one consumer: one row
// per message in the inbox's ledger table (the inbox table's name and
// "_ledger", created by [SQL.Migrate]), in the database of the inbox, so
// that every instance of the consumer and every restart count one
// message's handler runs together. Its answers to OpBegin, OpFail and
// OpFailBegun say a message is processed (and write nothing) when the
// inbox table holds its id, as [SQL.Handle] records it, read in the
// write's own transaction.
// Make it with [SQL.Ledger]; it is safe for concurrent use.
type SQLLedger struct {
	s        *SQL
	consumer string
}

var _ Ledger = (*SQLLedger)(nil)

// Ledger returns the ledger of the messages consumer handles through this
// inbox, for a broker adapter's Ledger setting: give it the consumer name
// of [SQL.Handle].
func (s *SQL) Ledger(consumer string) *SQLLedger {
	return &SQLLedger{s: s, consumer: consumer}
}

// Apply implements [Ledger]: each write is one short transaction of its
// own, committed before Apply returns. A message without an id gives
// [ErrNoMessageID]; an invalid consumer, [ErrInvalidConsumer].
func (l *SQLLedger) Apply(ctx context.Context, k Key, op Op) (Record, error) {
	if l.s.DB == nil {
		return Record{}, errors.New("inbox: ledger: SQL.DB is nil")
	}
	if k.ID == "" {
		return Record{}, ErrNoMessageID
	}
	consumer, err := StoredConsumer(l.consumer, k.IDSpace)
	if err != nil {
		return Record{}, err
	}
	t, err := l.s.table()
	if err != nil {
		return Record{}, err
	}
	lt, err := ledgerTable(t)
	if err != nil {
		return Record{}, err
	}
	engine, err := l.s.engineOf(ctx)
	if err != nil {
		return Record{}, err
	}
	id := StoredID(k.ID)
	tx, err := l.s.DB.BeginTx(ctx, nil)
	if err != nil {
		return Record{}, fmt.Errorf("inbox: ledger: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // after a commit, a no-op
	rec, err := applyLedger(ctx, tx, engine, t, lt, consumer, l.consumer, id, op)
	if err != nil {
		return Record{}, fmt.Errorf("inbox: ledger: %s: %w", op, err)
	}
	if err := tx.Commit(); err != nil {
		return Record{}, fmt.Errorf("inbox: ledger: %s: commit: %w", op, err)
	}
	return rec, nil
}

// applyLedger makes op in tx for the message id of consumer (its stored
// form; legacy is the consumer's plain name) in the ledger table lt of
// the inbox table t.
func applyLedger(ctx context.Context, tx *sql.Tx, engine int32, t, lt, consumer, legacy, id string, op Op) (Record, error) {
	now := nowMicros(engine)
	upsert := func(failures, running, onConflict string) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+lt+" (consumer, id, failures, running, updated_at, format) VALUES ($1, $2, "+
			failures+", "+running+", "+now+", "+strconv.Itoa(ledgerFormat)+") ON CONFLICT (consumer, id) DO UPDATE SET "+onConflict+
			", updated_at = excluded.updated_at", consumer, id)
		return err
	}
	read := func() (Record, error) {
		var r Record
		err := tx.QueryRowContext(ctx, "SELECT failures, running FROM "+lt+" WHERE consumer = $1 AND id = $2", consumer, id).Scan(&r.Failures, &r.Running)
		if errors.Is(err, sql.ErrNoRows) {
			return Record{}, nil
		}
		return r, err
	}
	// inboxState reads whether the inbox holds the id as processed (as
	// its own row, not another id space's copy nor a tombstone, or as the
	// previous release's row under the consumer's plain name: see
	// recordOne), or holds its tombstone.
	inboxState := func() (processed, dead bool, err error) {
		err = tx.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM "+t+" WHERE consumer = $1 AND id = $3 AND format NOT IN ("+
			strconv.Itoa(formatCopy)+", "+strconv.Itoa(formatDeadLettered)+"))"+
			" OR EXISTS (SELECT 1 FROM "+t+" WHERE consumer = $2 AND id = $3 AND format = "+strconv.Itoa(formatLegacy)+"),"+
			" EXISTS (SELECT 1 FROM "+t+" WHERE consumer = $1 AND id = $3 AND format = "+strconv.Itoa(formatDeadLettered)+")",
			consumer, legacy, id).Scan(&processed, &dead)
		return processed, dead, err
	}
	switch op {
	case OpBegin, OpFail, OpFailBegun:
		// Processed: nothing is written, and the core acks (a failed
		// run's commit applied, its answer lost) and forgets the record.
		// Dead-lettered: nothing is written, and the core dead-letters
		// the delivery again, unrun.
		processed, dead, err := inboxState()
		if err != nil {
			return Record{}, err
		}
		if processed {
			return Record{Processed: true}, nil
		}
		if dead {
			return Record{DeadLettered: true}, nil
		}
	case OpTombstone:
		// The tombstone is the inbox's row of the id: its insert waits
		// for an effect's transaction that inserted the row and has not
		// ended, and then finds the row there (the effect won) or not
		// (this write wins, and the effect's insert, waiting, finds the
		// tombstone). Another id space's copy of the id (a consumer
		// without an id space) is taken over, as recordOne does.
		processed, _, err := inboxState()
		if err != nil {
			return Record{}, err
		}
		if processed {
			return Record{Processed: true}, nil
		}
		fresh, err := insertOne(ctx, tx, engine, t, consumer, id, formatDeadLettered)
		if err != nil {
			return Record{}, err
		}
		if !fresh {
			format, err := readFormat(ctx, tx, t, consumer, id)
			if err != nil {
				return Record{}, err
			}
			if format == formatCopy {
				_, err = tx.ExecContext(ctx, "UPDATE "+t+" SET format = "+strconv.Itoa(formatDeadLettered)+", processed_at = "+now+
					" WHERE consumer = $1 AND id = $2 AND format = "+strconv.Itoa(formatCopy), consumer, id)
				if err == nil {
					format, err = readFormat(ctx, tx, t, consumer, id)
				}
				if err != nil {
					return Record{}, err
				}
			}
			if format != formatDeadLettered {
				return Record{Processed: true}, nil
			}
		}
		r, err := read()
		r.DeadLettered = true
		return r, err
	}
	switch op {
	case OpBegin:
		if err := upsert("0", "1", "running = "+lt+".running + 1"); err != nil {
			return Record{}, err
		}
		r, err := read()
		r.Running-- // as it was before this run's
		return r, err
	case OpFail:
		if err := upsert("1", "0", "failures = "+lt+".failures + 1"); err != nil {
			return Record{}, err
		}
		return read()
	case OpFailBegun:
		if err := upsert("1", "0", "failures = "+lt+".failures + 1, running = CASE WHEN "+lt+".running > 0 THEN "+lt+".running - 1 ELSE 0 END"); err != nil {
			return Record{}, err
		}
		return read()
	case OpExcuse:
		_, err := tx.ExecContext(ctx, "UPDATE "+lt+" SET running = CASE WHEN running > 0 THEN running - 1 ELSE 0 END, updated_at = "+now+
			" WHERE consumer = $1 AND id = $2", consumer, id)
		if err != nil {
			return Record{}, err
		}
		return read()
	case OpForget:
		_, err := tx.ExecContext(ctx, "DELETE FROM "+lt+" WHERE consumer = $1 AND id = $2", consumer, id)
		return Record{}, err
	}
	return Record{}, fmt.Errorf("unknown op %d", op)
}

// Redrive clears the tombstone of the dead-lettered message k (see
// [OpTombstone]) and its ledger record, and reports whether there was a
// tombstone. Call it for each message before an operator redrives it
// from the dead-letter destination: until then, a delivery of its id is
// dead-lettered again, unrun. It never touches the row of a processed
// message: a redrive of one stays a duplicate. A message without an id
// gives [ErrNoMessageID].
func (l *SQLLedger) Redrive(ctx context.Context, k Key) (bool, error) {
	if l.s.DB == nil {
		return false, errors.New("inbox: redrive: SQL.DB is nil")
	}
	if k.ID == "" {
		return false, ErrNoMessageID
	}
	consumer, err := StoredConsumer(l.consumer, k.IDSpace)
	if err != nil {
		return false, err
	}
	t, err := l.s.table()
	if err != nil {
		return false, err
	}
	lt, err := ledgerTable(t)
	if err != nil {
		return false, err
	}
	id := StoredID(k.ID)
	tx, err := l.s.DB.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("inbox: redrive: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // after a commit, a no-op
	var n int64 = 1
	if !plant.RedriveKeepsTombstone { // a planted bug (internal/plant), false but in a test build
		r, err := tx.ExecContext(ctx, "DELETE FROM "+t+" WHERE consumer = $1 AND id = $2 AND format = "+strconv.Itoa(formatDeadLettered), consumer, id)
		if err != nil {
			return false, fmt.Errorf("inbox: redrive: %w", err)
		}
		if n, err = r.RowsAffected(); err != nil {
			return false, fmt.Errorf("inbox: redrive: %w", err)
		}
	}
	if n == 1 {
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+lt+" WHERE consumer = $1 AND id = $2", consumer, id); err != nil {
			return false, fmt.Errorf("inbox: redrive: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("inbox: redrive: commit: %w", err)
	}
	return n == 1, nil
}
