package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemhttp/idemserver"
)

var _ idemserver.Store = (*Store)(nil)

// Store is an [idemserver.Store] in the idemhttp_keys table, shared by
// every server instance that uses the same database, so that a retry that
// lands on another instance still finds the first request's claim or
// response.
//
// Time is the database's: lock timeouts and TTLs are measured with now() on
// the server, so the instances' clocks need not agree. Expired rows are
// invisible at once (a Claim takes them over) and deleted by [Store.Prune].
//
// Every statement names the table by the schema-qualified name NewStore
// found on db's search_path, so that a session SET search_path left on a
// pooled connection (or a handler's, on a connection it shares) never
// moves a record to another table, where its key would run again.
//
// A Store is safe for concurrent use. Create it with [NewStore] after
// [Migrate] has created the table.
type Store struct {
	db  DB
	sql *keysSQL
}

// NewStore returns a Store on db, which must reach the primary (see the
// package documentation), on the idemhttp_keys table that db's
// search_path finds now. It fails if there is none ([Migrate] has not
// run) or the database cannot be reached.
func NewStore(ctx context.Context, db DB) (*Store, error) {
	table, err := keysTable(ctx, db)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, sql: newKeysSQL(table)}, nil
}

// The claim (keysSQL.storeClaim) records a claim unless a live row holds
// the key. ON CONFLICT DO UPDATE ... WHERE takes over a row whose lock or
// TTL has expired, and locks the conflicting row even when its WHERE is
// false, so the row cannot change before the lookup reads it in the same
// transaction.
//
// It first tries the key's advisory lock, TxMiddleware's claim (see
// advisoryKey), and writes nothing without it: a TxMiddleware handler
// running with the key holds it, with its claim row not yet committed, and
// an insert of the same key would wait for that transaction to end, for as
// long as the handler runs (a duplicate then held a connection, unanswered,
// until its lock timeout and a 503). Without the lock and with no
// committed row to read, the key is in progress: 409, as TxMiddleware
// answers its own duplicates.

// beginReadCommitted begins the Store's transactions: their statements
// are written for READ COMMITTED, where each sees the rows committed
// before it began, and a row it waited for as it is now.
const beginReadCommitted = "BEGIN ISOLATION LEVEL READ COMMITTED"

// The lookup after the claim reads the row the claim left alone. It is a
// separate statement, not a CTE, because under READ COMMITTED a
// statement's snapshot may miss a row that a concurrent transaction
// committed while the claim waited for it; the next statement's snapshot
// sees it. (Unlike TxMiddleware's, it reads an expired row too, and says
// whether it is live: a claim that took the lock just found it live, in
// the same transaction, whose now() has not moved; one that did not take
// it must not take an expired row for the key's answer.)

// Claim implements [idemserver.Store.Claim] in one round trip: the claim
// and the lookup go in one pipeline, in a transaction at READ COMMITTED
// whatever the server's default: lookupSQL must see the row claimSQL
// waited for, and under REPEATABLE READ or SERIALIZABLE a claim that
// waited for a row another transaction updated (a Complete, a Renew)
// failed with a serialization error instead, which the middleware
// answers 503, where the duplicate is due its replay or 409.
//
// A Claim whose connection turns out dead is sent again (see [retry]).
// Should the first try have committed after all, the second finds a row
// holding its own token, which it reports as Claimed: tokens are unique per
// request, so no other request can have written it.
func (s *Store) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	if c.LockTimeout <= 0 {
		return idemserver.ClaimResult{}, errors.New("idemhttp/postgres: claim: lock timeout must be positive")
	}
	var res idemserver.ClaimResult
	err := retry(ctx, func() error {
		b := &pgx.Batch{}
		b.Queue(beginReadCommitted)
		row := rowKey(key)
		b.Queue(s.sql.storeClaim, row, []byte(c.Token), []byte(c.Fingerprint), c.LockTimeout, advisoryKey(s.sql.table, row))
		b.Queue(s.sql.storeLookup, rowKey(key))
		b.Queue("COMMIT")
		br := s.db.SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			res, err = readClaim(br, c)
		}
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil && cerr != nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return idemserver.ClaimResult{}, fmt.Errorf("idemhttp/postgres: claim: %w", err)
	}
	return res, nil
}

func readClaim(br pgx.BatchResults, c idemserver.Claim) (idemserver.ClaimResult, error) {
	var claimed bool
	switch err := br.QueryRow().Scan(&claimed); {
	case err == nil:
		return idemserver.ClaimResult{State: idemserver.Claimed}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return idemserver.ClaimResult{}, err
	}
	var (
		held, fp, record []byte
		live             bool
	)
	switch err := br.QueryRow().Scan(&held, &fp, &record, &live); {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && !live):
		// Not claimed, and no live committed row: the key's advisory lock
		// is held by a TxMiddleware handler whose claim row (or takeover
		// of an expired row) is not committed yet, or the row's holder
		// released it just now. In progress, its request's fingerprint
		// unknown until it commits: taken for this one's, as
		// TxMiddleware does (409, not 422). An expired row is no answer:
		// its response is past its TTL, and the key runs afresh.
		return idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: c.Fingerprint}, nil
	case err != nil:
		// Nothing is known.
		return idemserver.ClaimResult{}, err
	}
	switch {
	case record != nil:
		return idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: string(fp), Record: record}, nil
	case string(held) == c.Token:
		return idemserver.ClaimResult{State: idemserver.Claimed}, nil
	}
	return idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: string(fp)}, nil
}

// Complete implements [idemserver.Store.Complete]. An empty record is
// refused: it would read back as a claim still in progress.
//
// A completed row keeps its token, so that a Complete sent again after a
// dead connection (see [retry]) can tell its own earlier success, which
// it reports as success, from a lost claim.
func (s *Store) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if len(record) == 0 {
		return errors.New("idemhttp/postgres: complete: empty record")
	}
	tries := 0
	var done bool
	err := retry(ctx, func() error {
		tries++
		tag, err := s.db.Exec(ctx, s.sql.storeComplete, rowKey(key), []byte(token), record, ttl)
		if err != nil {
			return err
		}
		done = tag.RowsAffected() == 1
		if done || tries == 1 {
			return nil
		}
		err = s.db.QueryRow(ctx, s.sql.storeCompleted, rowKey(key), []byte(token)).Scan(&done)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: complete: %w", err)
	}
	if !done {
		return idemserver.ErrClaimLost
	}
	return nil
}

// Renew implements [idemserver.Store.Renew] with one token-checked UPDATE
// of the claim's expiry, measured with the database's now(). A Renew sent
// again after a dead connection (see [retry]) renews again, which is
// harmless.
func (s *Store) Renew(ctx context.Context, key, token string, lockTimeout time.Duration) error {
	if lockTimeout <= 0 {
		return errors.New("idemhttp/postgres: renew: lock timeout must be positive")
	}
	var n int64
	err := retry(ctx, func() error {
		tag, err := s.db.Exec(ctx, s.sql.storeRenew, rowKey(key), []byte(token), lockTimeout)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: renew: %w", err)
	}
	if n == 0 {
		return idemserver.ErrClaimLost
	}
	return nil
}

// Release implements [idemserver.Store.Release]. A Release sent again
// after a dead connection, whose first try deleted the claim after all,
// reports ErrClaimLost; the key is free either way.
func (s *Store) Release(ctx context.Context, key, token string) error {
	var n int64
	err := retry(ctx, func() error {
		tag, err := s.db.Exec(ctx, s.sql.storeRelease, rowKey(key), []byte(token))
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: release: %w", err)
	}
	if n == 0 {
		return idemserver.ErrClaimLost
	}
	return nil
}

// pruneChunk bounds the rows one Prune statement deletes, so that a prune
// after a long pause holds its row locks and its WAL burst briefly.
const pruneChunk = 5000

// Prune deletes every expired row (completed responses past their TTL,
// claims past their lock timeout) and returns how many it deleted. Expired
// rows are already invisible to Claim; Prune only reclaims their space, so
// run it now and then (every few minutes, from one instance or all: rows
// another Prune has locked are skipped). It deletes in chunks of 5000 rows;
// if ctx ends between chunks it returns the count so far with ctx's error.
func (s *Store) Prune(ctx context.Context) (int64, error) {
	var total int64
	for {
		var tag pgconn.CommandTag
		err := retry(ctx, func() (err error) {
			tag, err = s.db.Exec(ctx, s.sql.storePrune, pruneChunk)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("idemhttp/postgres: prune: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < pruneChunk {
			return total, nil
		}
	}
}
