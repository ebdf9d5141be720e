package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemhttp/idemserver"
)

// Recovery points are the multi-transaction form of Brandur Leach's atomic
// phases, for a [TxHandler] that must commit something before its request
// ends: typically the fact that it is about to call another service, or
// that service's answer, so that a run of the same key after a crash
// resumes from there instead of starting over.
//
// They fit TxMiddleware's claim: the key's advisory lock is held by the
// request's transaction for as long as the handler runs, so no other run
// of the key can start meanwhile, and a crash releases it at once. A phase
// saves its recovery point with [SaveRecoveryPoint], which commits at once
// in a transaction of its own (on the pool: a second connection while the
// request's is held); the next run of the key, after a rollback or a
// crash, finds it with [LoadRecoveryPoint]. Calls to other services carry
// keys from [TxKey.DeriveKey], so that a call resent after a crash is
// replayed, not repeated. The last phase commits with the response, in the
// request's transaction, and clears the key's points there with
// [ClearRecoveryPoints]; [PruneRecoveryPoints] removes those of requests
// never retried.
//
// A request whose effects all live in this database needs none of this:
// its one transaction is the single-transaction form.

// sql returns the statement s on the recovery table k's middleware
// resolved when it was made, so that a handler's search_path cannot move
// a point to another tenant's table; as it is for a TxKey made by hand.
func (k TxKey) sql(s string) string {
	if k.recovery == "" {
		return s
	}
	return strings.ReplaceAll(s, "idemhttp_recovery", k.recovery)
}

// Points are the request's, not only the key's: saved under the key and
// the request's fingerprint, so that after a run that saved one rolled
// back (releasing its key), the same key sent with another request does
// not resume from the first one's phase (it would skip its own payment
// and answer with the other's). A point saved before this release, under
// the key alone, is still found, as it was then. A TxKey made by hand
// has no request: its points are the key's.

// pointKey is the recovery table's key of k's points: the scoped key
// and, for a request's TxKey, its fingerprint.
func (k TxKey) pointKey() []byte {
	if k.request == "" {
		return k.legacyPointKey()
	}
	return rowKey(idemserver.ScopedKey(k.Scope, k.Key) + "\x00" + k.request)
}

// legacyPointKey is the key points were saved under before they were the
// request's.
func (k TxKey) legacyPointKey() []byte { return rowKey(idemserver.ScopedKey(k.Scope, k.Key)) }

// SaveRecoveryPoint records data as the recovery point named step of the
// request's key k, replacing an earlier one of that name, and commits it
// at once on db (the pool, not the request's transaction, which may yet
// roll back). Call it only from a handler that holds k, inside
// [TxMiddleware].
func SaveRecoveryPoint(ctx context.Context, db DB, k TxKey, step string, data []byte) error {
	if data == nil {
		data = []byte{}
	}
	err := retry(ctx, func() error {
		_, err := db.Exec(ctx, k.sql(`
INSERT INTO idemhttp_recovery (key, step, data) VALUES ($1, $2, $3)
ON CONFLICT (key, step) DO UPDATE SET data = excluded.data, created_at = now()`),
			k.pointKey(), step, data)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: save recovery point %s: %w", step, err)
	}
	return nil
}

// LoadRecoveryPoint returns the data of the recovery point named step of
// k, and false if there is none. db may be the pool or the request's
// transaction.
func LoadRecoveryPoint(ctx context.Context, db DB, k TxKey, step string) ([]byte, bool, error) {
	var data []byte
	err := retry(ctx, func() error {
		// The request's point, else one saved under the key alone (by
		// the previous release): the request's first.
		return db.QueryRow(ctx, k.sql(`SELECT data FROM idemhttp_recovery WHERE key IN ($1, $2) AND step = $3 ORDER BY key = $1 DESC LIMIT 1`),
			k.pointKey(), k.legacyPointKey(), step).Scan(&data)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("idemhttp/postgres: load recovery point %s: %w", step, err)
	}
	return data, true, nil
}

// ClearRecoveryPoints deletes every recovery point of k in tx, the
// request's transaction, so that they go when its response is stored and
// stay if it rolls back.
func ClearRecoveryPoints(ctx context.Context, tx pgx.Tx, k TxKey) error {
	_, err := tx.Exec(ctx, k.sql(`DELETE FROM idemhttp_recovery WHERE key IN ($1, $2)`), k.pointKey(), k.legacyPointKey())
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: clear recovery points: %w", err)
	}
	return nil
}

// PruneRecoveryPoints deletes recovery points saved more than age ago, by
// the database's clock: those of requests that were never retried. Give
// an age well past the clients' retry horizon (the TTL of stored
// responses is a safe choice), or a late retry starts over.
func PruneRecoveryPoints(ctx context.Context, db DB, age time.Duration) (int64, error) {
	var n int64
	err := retry(ctx, func() error {
		tag, err := db.Exec(ctx, `DELETE FROM idemhttp_recovery WHERE created_at < now() - $1::interval`, age)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return n, fmt.Errorf("idemhttp/postgres: prune recovery points: %w", err)
	}
	return n, nil
}
