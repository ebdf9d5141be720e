package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp/inbox"
)

// InboxLedger is the [inbox.Ledger] of an [Inbox] for one consumer: one
// row per message in the idemhttp_inbox_ledger table (created by
// [Migrate]; the same table and semantics as [inbox.SQLLedger], so the
// two may share it), counting the message's failed handler runs and the
// runs begun and never ended, for every instance of the consumer and
// every restart. Its answers to OpBegin, OpFail and OpFailBegun say a
// message is processed (and write nothing) when idemhttp_inbox holds its
// id, as [Inbox.Handle] records it. Make it with
// [Inbox.Ledger]; it is safe for concurrent use.
type InboxLedger struct {
	db       DB
	consumer string
}

var _ inbox.Ledger = (*InboxLedger)(nil)

// Ledger returns the ledger of the messages consumer handles through this
// inbox, for a broker adapter's Ledger setting: give it the consumer name
// of [Inbox.Handle].
func (in *Inbox) Ledger(consumer string) *InboxLedger {
	return &InboxLedger{db: in.db, consumer: consumer}
}

// The ledger's statements (inbox.SQLLedger's, in pgx's dialect). Each
// write is one transaction: the upsert, then the read of the row.
const (
	ledgerProcessed = `SELECT EXISTS (SELECT 1 FROM idemhttp_inbox WHERE consumer = $1 AND id = $3 AND format NOT IN (3, 4))` +
		` OR EXISTS (SELECT 1 FROM idemhttp_inbox WHERE consumer = $2 AND id = $3 AND format = 1),` +
		` EXISTS (SELECT 1 FROM idemhttp_inbox WHERE consumer = $1 AND id = $3 AND format = 4)`
	ledgerTombstone = `INSERT INTO idemhttp_inbox (consumer, id, processed_at, format) VALUES ($1, $2, ` + inboxNow + `, 4) ON CONFLICT DO NOTHING`
	ledgerBuryCopy  = `UPDATE idemhttp_inbox SET format = 4, processed_at = ` + inboxNow + ` WHERE consumer = $1 AND id = $2 AND format = 3`
	ledgerRead      = `SELECT failures, running FROM idemhttp_inbox_ledger WHERE consumer = $1 AND id = $2`
	ledgerRedrive   = `DELETE FROM idemhttp_inbox WHERE consumer = $1 AND id = $2 AND format = 4`
	ledgerUpsert    = `INSERT INTO idemhttp_inbox_ledger AS l (consumer, id, failures, running, updated_at, format)` +
		` VALUES ($1, $2, $3, $4, ` + inboxNow + `, 1) ON CONFLICT (consumer, id) DO UPDATE SET` +
		` failures = l.failures + excluded.failures,` +
		` running = CASE WHEN $5 THEN GREATEST(l.running - 1, 0) ELSE l.running + excluded.running END,` +
		` updated_at = excluded.updated_at` +
		` RETURNING failures, running`
	ledgerExcuse = `UPDATE idemhttp_inbox_ledger SET running = GREATEST(running - 1, 0), updated_at = ` + inboxNow +
		` WHERE consumer = $1 AND id = $2 RETURNING failures, running`
	ledgerForget = `DELETE FROM idemhttp_inbox_ledger WHERE consumer = $1 AND id = $2`
)

// Apply implements [inbox.Ledger]: each write is one short transaction,
// committed before Apply returns. A message without an id gives
// [inbox.ErrNoMessageID]; an invalid consumer, [inbox.ErrInvalidConsumer].
func (l *InboxLedger) Apply(ctx context.Context, k inbox.Key, op inbox.Op) (inbox.Record, error) {
	if k.ID == "" {
		return inbox.Record{}, inbox.ErrNoMessageID
	}
	consumer, err := inbox.StoredConsumer(l.consumer, k.IDSpace)
	if err != nil {
		return inbox.Record{}, err
	}
	id := inbox.StoredID(k.ID)
	var rec inbox.Record
	err = pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		var err error
		rec, err = applyLedger(ctx, tx, consumer, l.consumer, id, op)
		return err
	})
	if err != nil {
		return inbox.Record{}, fmt.Errorf("idemhttp/postgres: inbox ledger: %s: %w", op, err)
	}
	return rec, nil
}

func applyLedger(ctx context.Context, tx pgx.Tx, consumer, legacy, id string, op inbox.Op) (inbox.Record, error) {
	var r inbox.Record
	var processed, dead bool
	switch op {
	case inbox.OpBegin, inbox.OpFail, inbox.OpFailBegun, inbox.OpTombstone:
		// A processed message: nothing written (a failed run whose
		// commit applied, its answer lost, is acked by the core). A
		// dead-lettered one (its tombstone): nothing written either.
		if err := tx.QueryRow(ctx, ledgerProcessed, consumer, legacy, id).Scan(&processed, &dead); err != nil {
			return r, err
		}
		if processed {
			return inbox.Record{Processed: true}, nil
		}
		if dead && op != inbox.OpTombstone {
			return inbox.Record{DeadLettered: true}, nil
		}
	}
	switch op {
	case inbox.OpBegin:
		err := tx.QueryRow(ctx, ledgerUpsert, consumer, id, 0, 1, false).Scan(&r.Failures, &r.Running)
		r.Running-- // as it was before this run's
		return r, err
	case inbox.OpFail, inbox.OpFailBegun:
		err := tx.QueryRow(ctx, ledgerUpsert, consumer, id, 1, 0, op == inbox.OpFailBegun).Scan(&r.Failures, &r.Running)
		return r, err
	case inbox.OpExcuse:
		err := tx.QueryRow(ctx, ledgerExcuse, consumer, id).Scan(&r.Failures, &r.Running)
		if errors.Is(err, pgx.ErrNoRows) {
			return inbox.Record{}, nil
		}
		return r, err
	case inbox.OpForget:
		_, err := tx.Exec(ctx, ledgerForget, consumer, id)
		return inbox.Record{}, err
	case inbox.OpTombstone:
		// The inbox's row of the id, as inbox.SQLLedger writes it: its
		// insert waits for an effect's transaction that inserted the row,
		// and the first of the two to commit wins.
		tag, err := tx.Exec(ctx, ledgerTombstone, consumer, id)
		if err != nil {
			return r, err
		}
		if tag.RowsAffected() == 0 {
			if _, err := tx.Exec(ctx, ledgerBuryCopy, consumer, id); err != nil {
				return r, err
			}
			var format int
			if err := tx.QueryRow(ctx, inboxFormat, consumer, id).Scan(&format); err != nil {
				return r, err
			}
			if format != 4 {
				return inbox.Record{Processed: true}, nil
			}
		}
		err = tx.QueryRow(ctx, ledgerRead, consumer, id).Scan(&r.Failures, &r.Running)
		if errors.Is(err, pgx.ErrNoRows) {
			err = nil
		}
		r.DeadLettered = true
		return r, err
	}
	return r, fmt.Errorf("unknown op %d", op)
}

// Redrive clears the tombstone of the dead-lettered message k (see
// [inbox.OpTombstone]) and its ledger record, and reports whether there
// was a tombstone, as [inbox.SQLLedger.Redrive] does: call it for each
// message before an operator redrives it from the dead-letter
// destination. A processed message's row is never touched.
func (l *InboxLedger) Redrive(ctx context.Context, k inbox.Key) (bool, error) {
	if k.ID == "" {
		return false, inbox.ErrNoMessageID
	}
	consumer, err := inbox.StoredConsumer(l.consumer, k.IDSpace)
	if err != nil {
		return false, err
	}
	id := inbox.StoredID(k.ID)
	var was bool
	err = pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, ledgerRedrive, consumer, id)
		if err != nil {
			return err
		}
		if was = tag.RowsAffected() == 1; was {
			_, err = tx.Exec(ctx, ledgerForget, consumer, id)
		}
		return err
	})
	if err != nil {
		return false, fmt.Errorf("idemhttp/postgres: inbox ledger: redrive: %w", err)
	}
	return was, nil
}
