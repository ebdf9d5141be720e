package postgres

import (
	"context"
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

	// SecretHeaders names request headers never written to the table, in
	// addition to those [idemhttp.SafeHeader] always withholds. Names are
	// matched in any letter case.
	SecretHeaders []string
}

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
// Entries never hold the Authorization, Cookie or Proxy-Authorization
// headers, nor any header in [JournalOptions.SecretHeaders], nor a URL
// password, whatever the caller passes.
//
// A Journal is safe for concurrent use. Create it with [NewJournal] after
// [Migrate] has created the table.
type Journal struct {
	db         DB
	worker     string
	lease      time.Duration
	omitBodies bool
	secret     []string // SecretHeaders, beyond what idemhttp.SanitizeEntry always withholds
}

// NewJournal returns a Journal on db, which must reach the primary. A nil
// opts means the defaults.
func NewJournal(db DB, opts *JournalOptions) *Journal {
	if opts == nil {
		opts = &JournalOptions{}
	}
	j := &Journal{
		db:         db,
		worker:     opts.Worker,
		lease:      opts.Lease,
		omitBodies: opts.OmitBodies,
		secret:     slices.Clone(opts.SecretHeaders),
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
// leases do, so that workers' clocks need not agree.
const beginSQL = `
INSERT INTO idemhttp_journal (key, operation, method, url, header, body, fingerprint, state,
    created_at, updated_at, attempts, last_status, lease_owner, lease_expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $9, $10, $11, $12,
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
// sanitised copy of e (state pending, Created and Updated set to now when
// zero, secret headers, URL password and with OmitBodies the body removed),
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
				rec.Created, rec.Updated, rec.Attempts, rec.LastStatus, leaseOwner, lease)
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
// is [idemhttp.SanitizeEntry]'s rule, shared with every journal.
func (j *Journal) sanitize(e *idemhttp.Entry) (*idemhttp.Entry, []byte, error) {
	rec, err := idemhttp.SanitizeEntry(e, j.secret...)
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
// entry's attempts and sets its state, last status and Updated time (o.At,
// or now when zero). A definite outcome (done or abandoned) ends the
// entry's lease; a pending one keeps it, so the entry waits for the lease
// to expire before another worker retries it.
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
	at := o.At
	if at.IsZero() {
		at = time.Now()
	}
	// Sent again after a dead connection, a Finish whose first try
	// committed after all counts its attempts twice; nothing else changes.
	var tag pgconn.CommandTag
	err := retry(ctx, func() (err error) {
		tag, err = j.db.Exec(ctx, `
UPDATE idemhttp_journal SET
    attempts = attempts + $2,
    last_status = CASE WHEN state = 'done' AND $3 = 'pending' THEN last_status ELSE $4 END,
    updated_at = CASE WHEN state = 'done' AND $3 = 'pending' THEN updated_at ELSE $5 END,
    lease_owner = CASE WHEN $3 = 'pending' THEN lease_owner END,
    lease_expires_at = CASE WHEN $3 = 'pending' THEN lease_expires_at END,
    state = CASE WHEN state = 'done' AND $3 = 'pending' THEN state ELSE $3 END
WHERE key = $1`, key, o.Attempts, string(o.State), o.Status, at)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w", key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w", key, idemhttp.ErrNotFound)
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
UPDATE idemhttp_journal j SET lease_owner = $2, lease_expires_at = now() + $3::interval
FROM free
WHERE j.key = free.key AND j.state = 'pending'
    AND (j.lease_expires_at IS NULL OR j.lease_expires_at <= now())
RETURNING `+entryColumns("j."), limit, j.worker, j.lease)
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
