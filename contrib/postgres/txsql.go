package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"strings"
)

// The statements of TxMiddleware and Store. Each names the key table by
// the schema-qualified name resolved when the middleware or the store was
// made (keysTable), never through the search_path at the time it runs: a
// handler's SET LOCAL search_path (a schema per tenant) or a session SET
// left on a pooled connection must not move a record to another table,
// where its key would run again (issue 30, §2.2).

// A request's transaction takes three round trips on a *pgxpool.Pool, as
// many as a handler that begins and commits its own: BEGIN with the claim
// (pgx's Batch.BeginTx), the handler's statements, and the stored
// response with COMMIT (a pipeline on the connection, which goes back to
// the pool once the session is idle). On another DB the response and
// COMMIT take a round trip each.

// The claim is the key's transaction-level advisory lock (a 64-bit hash
// of the key and its table), tried, never waited for: a duplicate of a
// running request answers 409 at once, and neither waits on the runner's
// rows nor holds a connection doing so. With the lock, the same statement
// writes the key's claim row (record NULL, kept for the TTL) in the
// request's transaction, and the statement that stores the response
// updates it (the same tuple's page: a HOT update, since no indexed
// column changes: now() is the transaction's start in both).
//
// The claim row is what keeps a handler that commits and goes on
// (COMMIT, COMMIT AND CHAIN, which release the transaction's locks) from
// letting a duplicate run: its COMMIT commits the claim row too, so a
// duplicate that then takes the free lock finds the row in progress (409);
// once the handler returns, the key is kept as completed, not replayable
// (410). Should the server die in between, the row holds the key for the
// TTL: the handler's effect may have committed. A version that wrote the
// row only at the end let such a duplicate run the handler again (two
// charges). An earlier one still inserted a claim row under a short
// lock_timeout and updated it: the timeout fired on unrelated waits
// (relation extension) and answered 409 for a free key; here the lock is
// taken first, and the insert waits for no one but a Store's claim of the
// same key.
//
// The same statement reads the transaction's start time
// (transaction_timestamp()), which names the transaction on its
// connection: a handler may end it (COMMIT or ROLLBACK through tx.Exec or
// its Conn) and even begin another, and a record written then would commit
// apart from the handler's writes. The statement that writes the record
// (storeGuard) compares it first, and so does the one that goes with a
// rollback (sameTxSQL), to tell a handler that ended the transaction from
// one that failed. A transaction the handler began later starts later: at
// least a round trip after this statement answered. The check costs
// nothing more than this column and a parameter: a first version marked
// the transaction with two settings (one of them reported by the server
// when it changes, the end of the transaction included), which cost a
// dozen allocations and two protocol messages per request.

// txStartSQL is the transaction's start in microseconds since 1970, a
// bigint: cheaper to read and send back than a timestamptz (no scan or
// encode plan per request), and computed the same way each time.
const txStartSQL = `(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint`

// sameTxSQL reads whether the connection's transaction is the claim's,
// begun at $1 (txStartSQL).
const sameTxSQL = `SELECT ` + txStartSQL + ` = $1`

// divisionByZero is SQLSTATE 22012, storeGuard's "claim lost".
const divisionByZero = "22012"

// numericOutOfRange is SQLSTATE 22003, storeGuard's "not the claim's
// transaction".
const numericOutOfRange = "22003"

const setIdleTimeoutSQL = `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`

// keysSQL is the set of statements on one key table, made once.
type keysSQL struct {
	table string // the schema-qualified name

	// claim tries the key's lock ($1) and, with it, writes the claim row
	// of key $2 (token $3, fingerprint $4, for the TTL $5) unless a live
	// row holds the key; it returns whether it took the lock, the
	// transaction's start and the written row's ctid (NULL if it wrote
	// none). A live row is
	// left alone: ON CONFLICT ... WHERE false locks it without writing,
	// and sees its latest committed version even when the statement's
	// snapshot predates it, so a run that committed just before the lock
	// was free is not missed.
	claim string
	// lookup reads the key's live row, if any: a completed response to
	// replay, or a claim (a Store's, or a TxMiddleware handler's that
	// committed itself). An expired row is the claimer's to take over.
	lookup string
	// store writes the response into the request's claim row, found by
	// its ctid ($4), which the claim returned: a read of the row by its
	// key would go through the index, and under SERIALIZABLE an index
	// read takes predicate locks on its pages, which other requests'
	// claim rows then write into: requests with different keys failed
	// each other (TestTxSerializableKeysDoNotConflict). A read by ctid
	// locks the tuple alone. Nothing but this transaction can move the
	// row before it commits.
	store string
	// storeGuard is store for a pipeline with COMMIT: it fails unless the
	// transaction is the claim's, the one begun at $4 (the largest integer
	// plus one: numeric_value_out_of_range), and unless it wrote the row
	// (division_by_zero: the claim is lost). Either failure aborts the
	// transaction, so the COMMIT queued after it can commit neither the
	// business write without its record nor the record in a transaction
	// the handler began.
	storeGuard string
	// mark keeps the key completed with the record $4 (the not-replayable
	// marker) after the handler ended the transaction itself: over the
	// request's own claim row, which the handler's COMMIT may have
	// committed, or an expired row.
	mark string

	// Store's:
	storeClaim, storeLookup, storeComplete, storeCompleted, storeRenew, storeRelease, storePrune string
}

// newKeysSQL returns the statements on the key table named table.
func newKeysSQL(table string) *keysSQL {
	q := func(s string) string { return strings.ReplaceAll(s, "idemhttp_keys", table) }
	store := q(`UPDATE idemhttp_keys SET record = $3 WHERE ctid = $4 AND key = $1 AND token = $2 AND record IS NULL`)
	return &keysSQL{
		table: table,
		claim: q(`
WITH l AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($1) AS locked, ` + txStartSQL + ` AS began),
c AS (
  INSERT INTO idemhttp_keys AS k (key, token, fingerprint, record, expires_at)
  SELECT $2, $3, $4, NULL, now() + $5::interval FROM l WHERE l.locked
  ON CONFLICT (key) DO UPDATE
  SET token = excluded.token, fingerprint = excluded.fingerprint, record = NULL, expires_at = excluded.expires_at
  WHERE k.expires_at <= now()
  RETURNING k.ctid)
SELECT l.locked, l.began, (SELECT ctid FROM c) FROM l`),
		lookup: q(`SELECT token, fingerprint, record FROM idemhttp_keys WHERE key = $1 AND expires_at > now()`),
		store:  store,
		storeGuard: `
WITH stored AS (` + store + ` RETURNING 1)
SELECT 2147483647 + (` + txStartSQL + ` <> $5)::int, 1 / count(*) FROM stored`,
		mark: q(`
INSERT INTO idemhttp_keys AS k (key, token, fingerprint, record, expires_at)
VALUES ($1, $2, $3, $4, now() + $5::interval)
ON CONFLICT (key) DO UPDATE
SET token = excluded.token, fingerprint = excluded.fingerprint, record = excluded.record, expires_at = excluded.expires_at
WHERE k.expires_at <= now() OR k.token = excluded.token`),

		storeClaim: q(`
WITH l AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($5) AS locked)
INSERT INTO idemhttp_keys AS k (key, token, fingerprint, record, expires_at)
SELECT $1, $2, $3, NULL, now() + $4::interval FROM l WHERE l.locked
ON CONFLICT (key) DO UPDATE
SET token = excluded.token, fingerprint = excluded.fingerprint, record = NULL, expires_at = excluded.expires_at
WHERE k.expires_at <= now()
RETURNING true`),
		storeLookup: q(`SELECT token, fingerprint, record, expires_at > now() FROM idemhttp_keys WHERE key = $1`),
		storeComplete: q(`
UPDATE idemhttp_keys SET record = $3, expires_at = now() + $4::interval
WHERE key = $1 AND token = $2 AND record IS NULL AND expires_at > now()`),
		storeCompleted: q(`SELECT true FROM idemhttp_keys WHERE key = $1 AND token = $2 AND record IS NOT NULL`),
		storeRenew: q(`
UPDATE idemhttp_keys SET expires_at = now() + $3::interval
WHERE key = $1 AND token = $2 AND record IS NULL AND expires_at > now()`),
		storeRelease: q(`
DELETE FROM idemhttp_keys
WHERE key = $1 AND token = $2 AND record IS NULL AND expires_at > now()`),
		storePrune: q(`
WITH doomed AS MATERIALIZED (
    SELECT key FROM idemhttp_keys WHERE expires_at <= now()
    LIMIT $1 FOR UPDATE SKIP LOCKED)
DELETE FROM idemhttp_keys k USING doomed d
WHERE k.key = d.key AND k.expires_at <= now()`),
	}
}

// advisoryKey is the advisory lock of a row key in table (its
// schema-qualified name): the first 8 bytes of the SHA-256 of both.
// Advisory locks are the database's, shared by every schema in it, so a
// hash of the key alone made two applications in separate schemas block
// each other (409) on the same key. Two keys share a lock with odds of
// 2^-64 (then one of them answers 409 while the other runs); an
// application's own advisory locks on small integers never meet it.
//
// It is a persisted format of a kind: instances of two releases serving
// the same keys side by side (a rolling deploy) exclude each other only if
// they compute the same lock; TestAdvisoryKeyGolden pins it to the
// previous release's.
func advisoryKey(table string, row []byte) int64 {
	var buf [512]byte // most names and keys fit; longer ones spill to the heap
	b := append(buf[:0], table...)
	b = append(b, 0) // a quoted identifier holds no NUL
	sum := sha256.Sum256(append(b, row...))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}
