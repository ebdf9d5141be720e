package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemhttp"
)

// DefaultLease is how long an entry stays reserved for the worker that
// began or claimed it when [JournalOptions.Lease] is zero: long enough for
// a call with [idemhttp.DefaultPolicy]'s retries and waits to finish.
const DefaultLease = 5 * time.Minute

// JournalOptions configures [NewJournal]. A nil *JournalOptions and the
// zero value both mean the defaults.
type JournalOptions struct {
	// Worker names this process in the entries it leases (the
	// lease_owner column), for operators reading the table. Empty means
	// "hostname:pid". Names need not be unique: leases are exclusive by
	// their expiry, not by the name.
	Worker string

	// Lease is how long an entry begun or claimed by this journal is
	// reserved for it: [Journal.ClaimPending] in other processes skips it
	// until then. Zero means [DefaultLease]. Set it above the longest
	// call the worker makes, retries included; a worker that runs past its
	// lease is not an error (the entry's key makes a second sender safe),
	// only wasted work.
	Lease time.Duration

	// OmitBodies keeps request bodies out of the table; fingerprints are
	// still stored. An entry without its body cannot be resent.
	OmitBodies bool

	// ClientClock makes the journal store the times it is given (the
	// entry's Created and Updated, the outcome's At) instead of the
	// database's now(). By default every created_at and updated_at comes
	// from the database's clock, so that a fleet's entries are ordered and
	// aged by one clock however far the workers' clocks drift. Tests that
	// simulate time set it.
	ClientClock bool
}

// ErrLeaseLost is returned, wrapped in a [*LeaseLostError], by
// [Journal.Finish] and [Journal.Renew] when another worker holds a live
// lease on the entry: this worker's lease expired and the entry was
// claimed again. The worker must stop working on the entry; the new
// holder resends it with the same key.
var ErrLeaseLost = errors.New("idemhttp/postgres: lease lost")

// LeaseLostError says which entry's lease was lost, and to whom.
type LeaseLostError struct {
	Key   string // the entry's key
	Owner string // the worker now holding the lease, or "" if none does
}

// Error says which entry's lease was lost, and to whom.
func (e *LeaseLostError) Error() string {
	if e.Owner == "" {
		return "idemhttp/postgres: lease lost on entry " + e.Key
	}
	return "idemhttp/postgres: lease lost on entry " + e.Key + " (now held by " + e.Owner + ")"
}

// Unwrap returns [ErrLeaseLost].
func (e *LeaseLostError) Unwrap() error { return ErrLeaseLost }

var _ idemhttp.Journal = (*Journal)(nil)

// Journal is an [idemhttp.Journal] in the idemhttp_journal table, shared by
// a fleet of worker processes that work through one batch. Every write is
// committed (and, with PostgreSQL's default synchronous_commit, on the
// primary's disk) before the method returns.
//
// Besides the [idemhttp.Journal] methods, which [idemhttp.Client] calls, a
// Journal leases pending entries to workers: [Journal.Begin] leases the
// entry it writes to its own worker, [Journal.Enqueue] writes an entry no
// one holds, and [Journal.ClaimPending] leases the oldest pending entries
// that no live lease holds, with SELECT ... FOR UPDATE SKIP LOCKED, so
// concurrent workers never claim the same entry at once. A worker that dies
// leaves its entries pending; when their leases expire another worker
// claims them and resends them with the same key, and the server replays
// or runs them once. See the package documentation for the worker loop.
//
// Entries never hold what [idemhttp.Entry.Sanitized] removes (the
// Authorization, Cookie and Proxy-Authorization headers, a URL's user part
// or fragment) nor a URL with a credential in its query, whatever the
// caller passes; the headers a Client's SecretHeaders names never reach
// the journal.
//
// A Journal is safe for concurrent use. Create it with [NewJournal] after
// [Migrate] has created the table.
type Journal struct {
	db          DB
	worker      string
	token       string // this Journal's leases, unique even when worker names are not
	lease       time.Duration
	omitBodies  bool
	clientClock bool
}

// NewJournal returns a Journal on db, which must reach the primary. A nil
// opts means the defaults.
func NewJournal(db DB, opts *JournalOptions) *Journal {
	if opts == nil {
		opts = &JournalOptions{}
	}
	j := &Journal{
		db:          db,
		worker:      opts.Worker,
		lease:       opts.Lease,
		omitBodies:  opts.OmitBodies,
		clientClock: opts.ClientClock,
		token:       newLeaseToken(),
	}
	if j.worker == "" {
		host, _ := os.Hostname()
		j.worker = host + ":" + strconv.Itoa(os.Getpid())
	}
	if j.lease <= 0 {
		j.lease = DefaultLease
	}
	return j
}

func newLeaseToken() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Worker returns the name this journal writes as the lease owner.
func (j *Journal) Worker() string { return j.worker }

// entryColumns lists the columns scanEntry reads, in its order, each
// qualified with table (an alias and a dot, or "").
func entryColumns(table string) string {
	return fmt.Sprintf(`%[1]skey, coalesce(%[1]soperation, ''), %[1]smethod, %[1]surl, %[1]sheader,
    %[1]sbody, %[1]sfingerprint, %[1]screated_at, %[1]supdated_at, %[1]sattempts, %[1]slast_status, %[1]sstate`, table)
}

// selectEntries reads entries; a WHERE clause follows.
var selectEntries = "SELECT " + entryColumns("") + " FROM idemhttp_journal "

// beginSQL inserts an entry unless its key or operation is taken. The
// lease ends Lease from now by the database's clock, as ClaimPending's
// leases do, so that workers' clocks need not agree; the times are the
// database's too unless given ($8 and $9 not NULL: ClientClock).
const beginSQL = `
INSERT INTO idemhttp_journal (key, operation, method, url, header, body, fingerprint, state,
    created_at, updated_at, attempts, last_status, lease_owner, lease_token, lease_expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', coalesce($8, now()), coalesce($9, now()), $10, $11, $12,
    CASE WHEN $12::text IS NULL THEN NULL ELSE $14 END,
    CASE WHEN $12::text IS NULL THEN NULL ELSE now() + $13::interval END)
ON CONFLICT DO NOTHING
RETURNING true`

// existingSQL reads the entry beginSQL conflicted with: the operation's
// when there is one, else the key's.
var existingSQL = selectEntries + `
WHERE key = $1 OR operation = $2
ORDER BY operation IS NOT DISTINCT FROM $2 DESC
LIMIT 1`

// beginAttempts bounds Begin's retries when the entry it conflicted with
// vanishes before it can be read (a concurrent Prune); two would do.
const beginAttempts = 5

// Begin implements [idemhttp.Journal.Begin]. The entry stored is a
// sanitised copy of e (state pending, Created and Updated the database's
// now() or, with ClientClock, e's own or now when zero, secret headers,
// URL password and with OmitBodies the body removed),
// leased to this journal's worker for its Lease, so that no other worker
// resends it while this one is sending it. e is not modified.
//
// Begin fails with an error wrapping [idemhttp.ErrInvalidKey] or
// [idemhttp.ErrInvalidRequest] for a bad key or operation id, and with
// [idemhttp.ErrInvalidRequest] for a method, URL or header that is not
// valid UTF-8 (a jsonb or text column would alter it), before touching
// the database.
func (j *Journal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return j.begin(ctx, e, true)
}

// Enqueue records e as pending like [Journal.Begin], but leases it to no
// one, so that the next [Journal.ClaimPending] of any worker may take it at
// once. A producer uses it to load a batch that a fleet of workers then
// works through; the entry must be complete (Key, Method, URL, Body and
// Fingerprint, from [idemhttp.Fingerprint] of the method, URL and body) so
// that a worker can send it. Like Begin, it returns the existing entry for
// e.Operation or e.Key instead of writing, if there is one.
func (j *Journal) Enqueue(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return j.begin(ctx, e, false)
}

func (j *Journal) begin(ctx context.Context, e *idemhttp.Entry, leased bool) (*idemhttp.Entry, error) {
	if e == nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal begin: %w: nil entry", idemhttp.ErrInvalidRequest)
	}
	rec, header, err := j.sanitize(e)
	if err != nil {
		return nil, err
	}
	// A cancelled context must never write, whichever point pgx happens to
	// check it at.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal begin %s: %w", rec.Key, err)
	}
	var op *string
	if rec.Operation != "" {
		op = &rec.Operation
	}
	var leaseOwner *string
	var lease time.Duration // with no owner, lease_expires_at is NULL below
	if leased {
		leaseOwner, lease = &j.worker, j.lease
	}
	var created, updated *time.Time // NULL: the database's now()
	if j.clientClock {
		created, updated = &rec.Created, &rec.Updated
	}
	for range beginAttempts {
		var (
			existing *idemhttp.Entry
			inserted bool
		)
		// Sent again after a dead connection, a Begin whose first try
		// committed after all finds its own entry and returns it: the
		// caller then uses the key it chose, as it would have.
		err := retry(ctx, func() error {
			// One pipeline, one implicit transaction: the insert, then, if
			// it conflicted on the key or the operation, the entry it
			// conflicted with, the operation's first. DO NOTHING takes no
			// row lock, so the entry may be pruned in between: then the
			// loop tries again.
			b := &pgx.Batch{}
			b.Queue(beginSQL, rec.Key, op, rec.Method, rec.URL, header, rec.Body, rec.Fingerprint,
				created, updated, rec.Attempts, rec.LastStatus, leaseOwner, lease, j.token)
			b.Queue(existingSQL, rec.Key, op)
			br := j.db.SendBatch(ctx, b)
			var err error
			existing, inserted, err = readBegin(br)
			if cerr := br.Close(); err == nil && cerr != nil {
				err = cerr
			}
			return err
		})
		switch {
		case err != nil:
			return nil, fmt.Errorf("idemhttp/postgres: journal begin %s: %w", rec.Key, err)
		case inserted:
			return nil, nil
		case existing != nil:
			return existing, nil
		}
	}
	return nil, fmt.Errorf("idemhttp/postgres: journal begin %s: the conflicting entry kept vanishing", rec.Key)
}

// readBegin reads Begin's pipeline: inserted, or the existing entry, or
// neither when the conflicting entry vanished.
func readBegin(br pgx.BatchResults) (existing *idemhttp.Entry, inserted bool, err error) {
	switch err := br.QueryRow().Scan(&inserted); {
	case err == nil:
		return nil, true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, false, err
	}
	e, err := scanEntry(br.QueryRow())
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	return e, false, err
}

// sanitize returns the entry to store and its header as JSON, or an error
// for an entry the table cannot hold faithfully. What may be stored at all
// is [idemhttp.Entry.Sanitized]'s rule, shared with every journal.
func (j *Journal) sanitize(e *idemhttp.Entry) (*idemhttp.Entry, []byte, error) {
	rec, err := e.Sanitized()
	if err != nil {
		return nil, nil, err
	}
	invalid := func(what string) error {
		return fmt.Errorf("idemhttp/postgres: journal begin %s: %w: %s", e.Key, idemhttp.ErrInvalidRequest, what)
	}
	for _, s := range []string{rec.Method, rec.URL, rec.Fingerprint} {
		if !textSafe(s) {
			return nil, nil, invalid("method, URL or fingerprint is not valid UTF-8 without NUL")
		}
	}
	for name, vals := range rec.Header {
		// jsonb would replace invalid UTF-8 and cannot hold NUL: refuse
		// rather than resend a header that differs from the original.
		if !textSafe(name) {
			return nil, nil, invalid("header name is not valid UTF-8")
		}
		for _, v := range vals {
			if !textSafe(v) {
				return nil, nil, invalid("header " + name + " is not valid UTF-8 without NUL")
			}
		}
	}
	header := []byte("{}")
	if rec.Header != nil {
		if header, err = json.Marshal(rec.Header); err != nil {
			return nil, nil, invalid(err.Error())
		}
	}
	if j.omitBodies {
		rec.Body = nil
	}
	return rec, header, nil
}

// textSafe reports whether s survives a PostgreSQL text or jsonb column
// unchanged.
func textSafe(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// scanEntry reads one row of entryColumns.
func scanEntry(row pgx.Row) (*idemhttp.Entry, error) {
	var (
		e      idemhttp.Entry
		header []byte
		state  string
	)
	err := row.Scan(&e.Key, &e.Operation, &e.Method, &e.URL, &header, &e.Body, &e.Fingerprint,
		&e.Created, &e.Updated, &e.Attempts, &e.LastStatus, &state)
	if err != nil {
		return nil, err
	}
	e.State = idemhttp.State(state)
	if err := json.Unmarshal(header, &e.Header); err != nil {
		return nil, fmt.Errorf("entry %s: header: %w", e.Key, err)
	}
	if len(e.Header) == 0 {
		e.Header = nil
	}
	return &e, nil
}

// Finish implements [idemhttp.Journal.Finish]: it adds o.Attempts to the
// entry's attempts and sets its state, last status and Updated time (the
// database's now(), or with ClientClock o.At, or now when zero). A
// definite outcome (done or abandoned) ends the entry's lease; a pending
// one keeps it, so the entry waits for the lease to expire before another
// worker retries it.
//
// Finish is fenced: while another worker (another Journal) holds a live
// lease on a pending entry, it changes nothing and returns a
// [*LeaseLostError] (errors.Is [ErrLeaseLost]): this worker's lease
// expired and the entry was claimed again, so the new holder's outcome is
// the one that counts. A lease that expired without being claimed again
// does not stop Finish.
//
// A done entry stays done: a pending outcome for it (a worker whose lease
// expired gave up after another worker finished the entry) only adds its
// attempts. Otherwise the entry would be resent, and if the server had
// forgotten its key by then, run twice.
//
// Finish returns an error wrapping [idemhttp.ErrNotFound] for an unknown
// key and [idemhttp.ErrInvalidRequest] for an unknown state.
func (j *Journal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	switch o.State {
	case idemhttp.StatePending, idemhttp.StateDone, idemhttp.StateAbandoned:
	default:
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w: unknown state %q", key, idemhttp.ErrInvalidRequest, o.State)
	}
	if o.Attempts < 0 {
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w: negative attempts", key, idemhttp.ErrInvalidRequest)
	}
	var at *time.Time // NULL: the database's now()
	if j.clientClock {
		t := o.At
		if t.IsZero() {
			t = time.Now()
		}
		at = &t
	}
	// Sent again after a dead connection, a Finish whose first try
	// committed after all counts its attempts twice; nothing else changes.
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = j.db.Exec(ctx, `
UPDATE idemhttp_journal SET
    attempts = attempts + $2,
    last_status = CASE WHEN state = 'done' AND $3 = 'pending' THEN last_status ELSE $4 END,
    updated_at = CASE WHEN state = 'done' AND $3 = 'pending' THEN updated_at ELSE coalesce($5, now()) END,
    lease_owner = CASE WHEN $3 = 'pending' THEN lease_owner END,
    lease_token = CASE WHEN $3 = 'pending' THEN lease_token END,
    lease_expires_at = CASE WHEN $3 = 'pending' THEN lease_expires_at END,
    state = CASE WHEN state = 'done' AND $3 = 'pending' THEN state ELSE $3 END
WHERE key = $1 AND NOT `+leasedToOther+``, key, o.Attempts, string(o.State), o.Status, at, j.token)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return j.missing(ctx, "finish", key)
	}
	return nil
}

// leasedToOther is true for a row that a live lease of another Journal
// holds ($6 is this Journal's token).
const leasedToOther = `(state = 'pending' AND lease_token IS DISTINCT FROM $6 AND lease_expires_at > now())`

// missing explains why an update fenced by leasedToOther changed no row:
// the entry is unknown, or another worker holds it.
func (j *Journal) missing(ctx context.Context, op, key string) error {
	var owner *string
	var leased bool
	err := retry(ctx, func() error {
		return j.db.QueryRow(ctx, `
SELECT lease_owner, lease_token IS NOT NULL AND lease_token <> $2 AND lease_expires_at > now()
FROM idemhttp_journal WHERE key = $1`, key, j.token).Scan(&owner, &leased)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("idemhttp/postgres: journal %s %s: %w", op, key, idemhttp.ErrNotFound)
	case err != nil:
		return fmt.Errorf("idemhttp/postgres: journal %s %s: %w", op, key, err)
	}
	lost := &LeaseLostError{Key: key}
	if leased && owner != nil {
		lost.Owner = *owner
	}
	return fmt.Errorf("idemhttp/postgres: journal %s: %w", op, lost)
}

// Renew extends this worker's lease on a pending entry to Lease from now
// (by the database's clock), for a worker still busy with it as its lease
// nears its end. It returns a [*LeaseLostError] (errors.Is [ErrLeaseLost])
// when this Journal no longer holds the lease: it expired and another
// worker claimed the entry, or the entry was finished. Then the worker
// must stop: someone else now owns the entry. An unknown key returns an
// error wrapping [idemhttp.ErrNotFound].
func (j *Journal) Renew(ctx context.Context, key string) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = j.db.Exec(ctx, `
UPDATE idemhttp_journal SET lease_expires_at = now() + $3::interval
WHERE key = $1 AND state = 'pending' AND lease_token = $2`, key, j.token, j.lease)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal renew %s: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return j.missing(ctx, "renew", key)
	}
	return nil
}

// Get implements [idemhttp.Journal.Get].
func (j *Journal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	var e *idemhttp.Entry
	err := retry(ctx, func() (err error) {
		e, err = scanEntry(j.db.QueryRow(ctx, selectEntries+`WHERE key = $1`, key))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("idemhttp/postgres: journal get %s: %w", key, idemhttp.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal get %s: %w", key, err)
	}
	return e, nil
}

// Lookup implements [idemhttp.Journal.Lookup]: the entry for operation,
// with its request, in one query.
func (j *Journal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	var e *idemhttp.Entry
	err := retry(ctx, func() (err error) {
		e, err = scanEntry(j.db.QueryRow(ctx, selectEntries+`WHERE operation = $1`, operation))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("idemhttp/postgres: journal lookup %s: %w", operation, idemhttp.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal lookup %s: %w", operation, err)
	}
	return e, nil
}

// Pending implements [idemhttp.Journal.Pending]: every pending entry,
// oldest Created first (ties in key order), leased or not. A fleet's
// workers use [Journal.ClaimPending] instead; [idemhttp.Client.Resume],
// which calls Pending, would resend entries other workers are sending.
func (j *Journal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	out, err := j.query(ctx, selectEntries+`WHERE state = 'pending' ORDER BY created_at, key`)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal pending: %w", err)
	}
	return out, nil
}

// ClaimPending leases up to limit pending entries that no live lease holds
// (never leased, or their lease expired) to this journal's worker for its
// Lease, and returns them oldest Created first. Concurrent calls, in any
// process, never return the same entry while its lease lasts: each skips
// the rows the others have locked (FOR UPDATE SKIP LOCKED) instead of
// waiting for them. An empty result means no entry is free now; entries
// leased by live workers may still be pending.
//
// Send each entry with its own key, operation and body (see the package
// documentation); its outcome, recorded through [Journal.Finish], ends the
// lease. limit must be positive.
func (j *Journal) ClaimPending(ctx context.Context, limit int) ([]*idemhttp.Entry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("idemhttp/postgres: claim pending: %w: limit %d", idemhttp.ErrInvalidRequest, limit)
	}
	// MATERIALIZED keeps the locking subquery from being inlined and run
	// more than once. The UPDATE rechecks the lease after locking: a row
	// another worker leased between the snapshot and the lock is skipped.
	out, err := j.query(ctx, `
WITH free AS MATERIALIZED (
    SELECT key FROM idemhttp_journal
    WHERE state = 'pending' AND (lease_expires_at IS NULL OR lease_expires_at <= now())
    ORDER BY created_at, key
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
UPDATE idemhttp_journal j SET lease_owner = $2, lease_token = $4, lease_expires_at = now() + $3::interval
FROM free
WHERE j.key = free.key AND j.state = 'pending'
    AND (j.lease_expires_at IS NULL OR j.lease_expires_at <= now())
RETURNING `+entryColumns("j."), limit, j.worker, j.lease, j.token)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: claim pending: %w", err)
	}
	slices.SortFunc(out, func(a, b *idemhttp.Entry) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out, nil
}

// query runs a statement that returns entries. Sent again after a dead
// connection, a ClaimPending whose first try committed after all leaves
// those entries leased until their lease expires: a delay, not a loss.
func (j *Journal) query(ctx context.Context, sql string, args ...any) ([]*idemhttp.Entry, error) {
	var out []*idemhttp.Entry
	err := retry(ctx, func() (err error) {
		out, err = j.queryOnce(ctx, sql, args...)
		return err
	})
	return out, err
}

func (j *Journal) queryOnce(ctx context.Context, sql string, args ...any) ([]*idemhttp.Entry, error) {
	rows, err := j.db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*idemhttp.Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Prune implements [idemhttp.Journal.Prune]. Pending and abandoned entries
// are never pruned.
func (j *Journal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = j.db.Exec(ctx, `DELETE FROM idemhttp_journal WHERE state = 'done' AND updated_at < $1`, cutoff)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemhttp/postgres: journal prune: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Delete implements [idemhttp.Journal.Delete]: it removes key's entry,
// whatever its state, or returns an error wrapping [idemhttp.ErrNotFound].
func (j *Journal) Delete(ctx context.Context, key string) error {
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = j.db.Exec(ctx, `DELETE FROM idemhttp_journal WHERE key = $1`, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal delete %s: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idemhttp/postgres: journal delete %s: %w", key, idemhttp.ErrNotFound)
	}
	return nil
}
