package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemhttp/inbox"
)

// Inbox is the consumer-side dedup of [inbox] with pgx: one row per
// processed message in the idemhttp_inbox table (created by [Migrate]),
// inserted with ON CONFLICT DO NOTHING in the same transaction as the
// message's effect. It has the semantics of [inbox.SQL], and the same
// table, so the two may share it; see the [inbox] package documentation
// for when to use it, where message ids come from, and retention.
//
// The table must be in the database of the business tables the handlers
// write, reached on the primary. processed_at comes from the database's
// clock, and so does [Inbox.Prune]'s cutoff. When the context of
// [Inbox.Process] or [Inbox.ProcessBatch] has a deadline (an adapter's
// processing limit), the transaction's statement_timeout, lock_timeout
// and idle_in_transaction_session_timeout are set to the time left, so
// that the server rolls it back, and releases the id's row lock, when a
// hung handler overruns it, even one that ignores its context.
//
// An Inbox is safe for concurrent use; its MinRetention must not change
// once it is in use. Create it with [NewInbox].
type Inbox struct {
	// MinRetention is the youngest age of the ids [Inbox.Prune] may
	// delete; zero means [inbox.DefaultMinRetention]. See
	// [inbox.SQL.MinRetention].
	MinRetention time.Duration

	db DB
}

// NewInbox returns an Inbox on db, which must reach the primary.
func NewInbox(db DB) *Inbox {
	return &Inbox{db: db}
}

// Process runs fn once for the message messageID of consumer: in one
// transaction it inserts (consumer, [inbox.StoredID](messageID)) with ON
// CONFLICT DO NOTHING and, if the row is new, calls fn with the
// transaction and commits. If the row exists, it runs nothing and returns
// Result{Duplicate: true}: ack the message. A concurrent delivery of the
// same id waits on the row until the first one's transaction ends.
//
// fn must do its work through tx and must not commit or roll it back.
// When fn fails (or panics) everything rolls back, the id included, and
// Process returns fn's error (or panics again): do not ack. Any other
// error means nothing is known to have committed (a failed COMMIT leaves
// the outcome unknown, which is safe: a redelivery of a committed id is a
// duplicate). An empty messageID gives [inbox.ErrNoMessageID] and an
// invalid consumer [inbox.ErrInvalidConsumer], and nothing runs.
func (in *Inbox) Process(ctx context.Context, consumer, messageID string, fn func(ctx context.Context, tx pgx.Tx) error) (inbox.Result, error) {
	res, err := in.ProcessBatch(ctx, consumer, []string{messageID}, func(ctx context.Context, tx pgx.Tx, _ int) error {
		return fn(ctx, tx)
	})
	if err != nil {
		return inbox.Result{}, err
	}
	return res[0], nil
}

// inboxInsertOne and inboxInsertMany record ids; RETURNING (or the row
// count) lists only the rows this statement inserted, so a row that
// another transaction inserted, committed or not, is not new.
// inboxInsertAll is the batch's first try, without ON CONFLICT: when every
// id is new (the common case) it is cheaper (no speculative insertion per
// row, about 40% of the statement's time), and when one is not it fails
// with a unique violation, after waiting, like ON CONFLICT, for a
// concurrent insert of that id to commit or roll back.
// processed_at is the database's clock: now(), the transaction's start.
// format says which release wrote a row, and why (inbox.SQL's formats,
// the same): 1, the column's default, the previous release's; 2, this
// release's record of a message in its id space; 3, this release's copy,
// under the consumer's plain name, of the record of a message with an id
// space, for the previous release's instances during a rolling deploy.
const (
	inboxNow        = `(extract(epoch from now()) * 1000000)::bigint`
	inboxInsertOne  = `INSERT INTO idemhttp_inbox (consumer, id, processed_at, format) VALUES ($1, $2, ` + inboxNow + `, 2) ON CONFLICT DO NOTHING`
	inboxInsertCopy = `INSERT INTO idemhttp_inbox (consumer, id, processed_at, format) VALUES ($1, $2, ` + inboxNow + `, 3) ON CONFLICT DO NOTHING`
	inboxInsertMany = `INSERT INTO idemhttp_inbox (consumer, id, processed_at, format) SELECT $1, unnest($2::text[]), ` + inboxNow + `, 2 ON CONFLICT DO NOTHING RETURNING id`
	inboxInsertAll  = `INSERT INTO idemhttp_inbox (consumer, id, processed_at, format) SELECT $1, unnest($2::text[]), ` + inboxNow + `, 2`
	inboxFormat     = `SELECT format FROM idemhttp_inbox WHERE consumer = $1 AND id = $2`
	inboxClaimCopy  = `UPDATE idemhttp_inbox SET format = 2, processed_at = ` + inboxNow + ` WHERE consumer = $1 AND id = ANY($2::text[]) AND format = 3 RETURNING id`
	inboxTombstone  = `SELECT id FROM idemhttp_inbox WHERE consumer = $1 AND id = ANY($2::text[]) AND format = 4 LIMIT 1`
)

// errSeenBefore: inboxInsertAll found an id already recorded; the
// transaction is aborted.
var errSeenBefore = errors.New("an id of the batch was recorded before")

// recordIDs records ids (stored forms) in tx and returns the set of those
// that were new. With optimistic set and more than one distinct id, it
// tries inboxInsertAll first and returns errSeenBefore, with tx aborted,
// when some id was recorded before. A single id of a consumer with an id
// space (legacy, its plain name, differs from consumer) is recorded with
// its legacy row too: see recordOne.
func recordIDs(ctx context.Context, tx pgx.Tx, consumer, legacy string, ids []string, optimistic bool) (map[string]bool, error) {
	fresh := make(map[string]bool, len(ids))
	if len(ids) == 1 {
		f, err := recordOne(ctx, tx, consumer, legacy, ids[0])
		if err != nil {
			return nil, err
		}
		fresh[ids[0]] = f
		return fresh, nil
	}
	// Sorted, so that two batches sharing ids lock their rows in the same
	// order and wait for each other instead of deadlocking.
	distinct := slices.Clone(ids)
	slices.Sort(distinct)
	distinct = slices.Compact(distinct)
	if optimistic {
		for _, id := range distinct {
			fresh[id] = true
		}
		_, err := tx.Exec(ctx, inboxInsertAll, consumer, distinct)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
			return nil, errSeenBefore
		}
		if err != nil {
			return nil, err
		}
		return fresh, nil
	}
	rows, err := tx.Query(ctx, inboxInsertMany, consumer, distinct)
	if err != nil {
		return nil, err
	}
	newIDs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, id := range newIDs {
		fresh[id] = true
	}
	if len(newIDs) == len(distinct) {
		return fresh, nil
	}
	// The others were there: the previous release's rows and this one's
	// are duplicates; another id space's copies are taken over.
	var taken []string
	for _, id := range distinct {
		if !fresh[id] {
			taken = append(taken, id)
		}
	}
	claimed, err := claimCopies(ctx, tx, consumer, taken)
	for _, id := range claimed {
		fresh[id] = true
	}
	return fresh, err
}

// batchTombstone fails a batch of several ids when one of those recorded
// before holds a dead letter's tombstone (format 4, [inbox.OpTombstone]),
// before anything of the batch runs, with an error wrapping
// [inbox.ErrDeadLettered] that names the message: its dead letter may
// have failed (the message was requeued, the tombstone stays), and
// answering it Duplicate would have it acked, neither processed nor
// dead-lettered. A batch of one reads its tombstone in recordOne.
func batchTombstone(ctx context.Context, tx pgx.Tx, consumer string, ids, stored []string, fresh map[string]bool) error {
	if len(stored) < 2 {
		return nil
	}
	var seen []string
	for _, id := range stored {
		if !fresh[id] {
			seen = append(seen, id)
		}
	}
	if len(seen) == 0 {
		return nil
	}
	var id string
	switch err := tx.QueryRow(ctx, inboxTombstone, consumer, seen).Scan(&id); {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("idemhttp/postgres: inbox: read tombstones: %w", err)
	}
	for i, s := range stored {
		if s == id {
			return fmt.Errorf("idemhttp/postgres: inbox: message %d of the batch (%q): %w", i, ids[i], inbox.ErrDeadLettered)
		}
	}
	return fmt.Errorf("idemhttp/postgres: inbox: a message of the batch: %w", inbox.ErrDeadLettered)
}

// recordOne records one message's id (its stored form) under consumer in
// tx and reports whether the message is new, as inbox.SQL does:
//
//   - With an id space (legacy, the consumer's plain name, differs from
//     consumer), it also records the copy (legacy, id), in the same round
//     trip, that an instance of the previous release running beside this
//     one in a rolling deploy reads, and that one processing the message
//     at the same moment waits on, as this insert waits on its. The
//     message is a duplicate when its own row was there, or when the
//     legacy row was there in the previous release's format (written by
//     it, before the upgrade or by an old instance now).
//   - Without one, its row is the legacy row: a row of the previous
//     release or its own makes it a duplicate; another id space's copy is
//     taken over.
//
// A tombstone in its own row (format 4, see [inbox.OpTombstone]) gives
// [inbox.ErrDeadLettered]: nothing runs.
func recordOne(ctx context.Context, tx pgx.Tx, consumer, legacy, id string) (bool, error) {
	var own, copied pgconn.CommandTag
	if legacy == consumer {
		var err error
		if own, err = tx.Exec(ctx, inboxInsertOne, consumer, id); err != nil {
			return false, err
		}
		if own.RowsAffected() == 1 {
			return true, nil
		}
	} else {
		b := &pgx.Batch{}
		b.Queue(inboxInsertOne, consumer, id)
		b.Queue(inboxInsertCopy, legacy, id)
		br := tx.SendBatch(ctx, b)
		var errOwn, errCopy error
		own, errOwn = br.Exec()
		copied, errCopy = br.Exec()
		if err := errors.Join(errOwn, errCopy, br.Close()); err != nil {
			return false, err
		}
		if own.RowsAffected() == 0 {
			// A duplicate, or a dead letter's tombstone.
			var format int
			if err := tx.QueryRow(ctx, inboxFormat, consumer, id).Scan(&format); err != nil {
				return false, err
			}
			if format == 4 {
				return false, inbox.ErrDeadLettered
			}
			return false, nil
		}
		if copied.RowsAffected() == 1 {
			return true, nil
		}
	}
	// A new statement: it sees the row another transaction committed
	// while the insert waited for it.
	var format int
	if err := tx.QueryRow(ctx, inboxFormat, legacy, id).Scan(&format); err != nil {
		return false, err
	}
	if legacy != consumer {
		return format != 1, nil
	}
	if format == 4 {
		return false, inbox.ErrDeadLettered
	}
	if format != 3 {
		return false, nil
	}
	claimed, err := claimCopies(ctx, tx, consumer, []string{id})
	return len(claimed) == 1, err
}

// claimCopies makes the copies among ids (another id space's, format 3)
// the records of the messages with no id space of consumer that have
// those ids, and returns the ids it took (not those a concurrent delivery
// took first).
func claimCopies(ctx context.Context, tx pgx.Tx, consumer string, ids []string) ([]string, error) {
	rows, err := tx.Query(ctx, inboxClaimCopy, consumer, ids)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// ProcessBatch is [Inbox.Process] for many messages in one transaction:
// one statement records every id (two when some id was processed before),
// in sorted order so that concurrent batches sharing ids cannot deadlock;
// fn(ctx, tx, i) runs for each message i
// whose id is new, in order, and the batch commits once. Results are in
// the order of ids; an id repeated within the batch is a duplicate after
// its first occurrence. When fn fails for any message the whole batch
// rolls back, ids included, and ProcessBatch returns the error: redeliver
// the batch. An empty id anywhere gives [inbox.ErrNoMessageID] before
// anything runs. A message that was dead-lettered (its tombstone, see
// [inbox.OpTombstone]: its dead letter may have failed and the message
// come back) fails the batch before anything runs, with an error wrapping
// [inbox.ErrDeadLettered] that names it: dead-letter that message again
// and redeliver the rest; never ack it as a duplicate.
func (in *Inbox) ProcessBatch(ctx context.Context, consumer string, ids []string, fn func(ctx context.Context, tx pgx.Tx, i int) error) ([]inbox.Result, error) {
	if _, err := inbox.StoredConsumer(consumer, ""); err != nil {
		return nil, err
	}
	return in.processBatch(ctx, consumer, consumer, ids, fn)
}

// processBatch is ProcessBatch for a consumer column already checked (and
// maybe scoped by an id space, see inbox.StoredConsumer); legacy is the
// consumer's plain name, equal to consumer when there is no id space.
func (in *Inbox) processBatch(ctx context.Context, consumer, legacy string, ids []string, fn func(ctx context.Context, tx pgx.Tx, i int) error) ([]inbox.Result, error) {
	stored := make([]string, len(ids))
	for i, id := range ids {
		if id == "" {
			return nil, fmt.Errorf("%w (message %d of the batch)", inbox.ErrNoMessageID, i)
		}
		stored[i] = inbox.StoredID(id)
	}
	if len(ids) == 0 {
		return nil, nil
	}

	var tx pgx.Tx
	begin := func() error {
		// A pooled connection found dead before BEGIN ran is replaced;
		// nothing has happened yet, so this is always safe.
		err := retry(ctx, func() (err error) {
			tx, err = in.db.Begin(ctx)
			return err
		})
		if err != nil {
			tx = nil
			return fmt.Errorf("idemhttp/postgres: inbox: begin: %w", err)
		}
		if err := limitInboxTx(ctx, tx); err != nil {
			return fmt.Errorf("idemhttp/postgres: inbox: set the transaction's timeouts: %w", err)
		}
		return nil
	}
	if err := begin(); err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		// Also on a panic in fn. A rollback that fails changes nothing:
		// the transaction is then gone with its connection.
		if !committed && tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	fresh, err := recordIDs(ctx, tx, consumer, legacy, stored, true)
	if errors.Is(err, errSeenBefore) {
		// Some id of the batch was processed before (typically a batch
		// redelivered after a crash): start again, asking which.
		_ = tx.Rollback(ctx)
		if err := begin(); err != nil {
			return nil, err
		}
		fresh, err = recordIDs(ctx, tx, consumer, legacy, stored, false)
	}
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: inbox: record ids: %w", err)
	}
	if err := batchTombstone(ctx, tx, consumer, ids, stored, fresh); err != nil {
		return nil, err
	}

	results := make([]inbox.Result, len(ids))
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
		return results, nil // nothing new: the deferred rollback ends it
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: inbox: commit (outcome unknown; a redelivery is safe): %w", err)
	}
	committed = true
	return results, nil
}

// limitInboxTx bounds tx by ctx's deadline, on the server: each
// statement, each wait for a lock, and each pause between statements ends
// when it passes. Without a deadline it sends nothing.
func limitInboxTx(ctx context.Context, tx pgx.Tx) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	left := time.Until(deadline)
	if left <= 0 {
		return context.DeadlineExceeded
	}
	// PostgreSQL reads 0 as "no limit": never less than a millisecond.
	ms := strconv.FormatInt(max(left.Milliseconds(), 1), 10) + "ms"
	_, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $1, true)", ms)
	return err
}

// Handle returns an [inbox.Handler] that processes each message with
// [Inbox.Process] as consumer, in the message's id space: its row is
// recorded under [inbox.StoredConsumer](consumer, m.IDSpace), so two
// sources whose ids overlap never take each other's messages for
// duplicates (unless their adapters declare one shared id space). fn
// runs, in the transaction, only for a message whose id is new; a
// duplicate returns nil, so the adapter acks it; a message without an id
// returns [inbox.ErrNoMessageID].
func (in *Inbox) Handle(consumer string, fn func(ctx context.Context, tx pgx.Tx, m *inbox.Message) error) inbox.Handler {
	return func(ctx context.Context, m *inbox.Message) error {
		c, err := inbox.StoredConsumer(consumer, m.IDSpace)
		if err != nil {
			return err
		}
		_, err = in.processBatch(ctx, c, consumer, []string{m.ID}, func(ctx context.Context, tx pgx.Tx, _ int) error {
			return fn(ctx, tx, m)
		})
		return err
	}
}

// inboxPruneSQL deletes a chunk of ids older than $1 microseconds by the
// database's clock, so that a prune never holds many row locks at once;
// ledgerPruneSQL, a chunk of ledger records untouched as long.
const (
	inboxPruneSQL  = `DELETE FROM idemhttp_inbox WHERE ctid = ANY (ARRAY(SELECT ctid FROM idemhttp_inbox WHERE processed_at < ` + inboxNow + ` - $1 LIMIT 1000))`
	ledgerPruneSQL = `DELETE FROM idemhttp_inbox_ledger WHERE ctid = ANY (ARRAY(SELECT ctid FROM idemhttp_inbox_ledger WHERE updated_at < ` + inboxNow + ` - $1 LIMIT 1000))`
)

// Prune deletes the ids processed more than olderThan ago, by the
// database's clock, a thousand rows per statement, and returns how many it
// deleted. It deletes the ledger's records ([Inbox.Ledger]) untouched for
// as long too, and does not count them. A redelivery of a pruned id runs
// its effect again, so olderThan must be at least [Inbox.MinRetention]
// (else an error wrapping [inbox.ErrRetention], and nothing is deleted):
// keep ids for longer than the broker can redeliver a message (see the
// [inbox] package documentation).
func (in *Inbox) Prune(ctx context.Context, olderThan time.Duration) (int64, error) {
	minimum := in.MinRetention
	if minimum <= 0 {
		minimum = inbox.DefaultMinRetention
	}
	if olderThan < minimum {
		return 0, fmt.Errorf("idemhttp/postgres: %w: %v is under %v (Inbox.MinRetention)", inbox.ErrRetention, olderThan, minimum)
	}
	total, err := in.prune(ctx, inboxPruneSQL, olderThan)
	if err != nil {
		return total, err
	}
	if _, err := in.prune(ctx, ledgerPruneSQL, olderThan); err != nil {
		return total, err
	}
	return total, nil
}

func (in *Inbox) prune(ctx context.Context, q string, olderThan time.Duration) (int64, error) {
	var total int64
	for {
		tag, err := in.db.Exec(ctx, q, olderThan.Microseconds())
		if err != nil {
			return total, fmt.Errorf("idemhttp/postgres: inbox: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < 1000 {
			return total, nil
		}
	}
}
