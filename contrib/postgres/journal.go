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
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
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
	// "hostname:pid". Names need not be unique: each Journal fences its
	// leases with a token of its own, not with the name.
	Worker string

	// Lease is how long an entry begun or claimed by this journal is
	// reserved for it: [Journal.ClaimPending] in other processes skips it
	// until then. Zero means [DefaultLease]. Set it above the longest
	// call the worker makes, retries included, or renew it
	// ([Journal.Renew]); a worker that runs past its lease while another
	// claims the entry does not run the operation twice (both send the
	// same key), but its outcome is refused ([ErrLeaseLost]).
	Lease time.Duration

	// OmitBodies keeps request bodies out of the table; fingerprints are
	// still stored. An entry without its body cannot be resent.
	OmitBodies bool

	// SecretHeaders names request headers never written to the table, in
	// any letter case, beyond those [idemhttp.Entry.Sanitized] always
	// withholds (Authorization, Cookie, API keys under their common
	// names): for entries a producer enqueues ([Journal.Enqueue]) or begins
	// directly. A Client drops its own [idemhttp.Client.SecretHeaders]
	// before Begin.
	SecretHeaders []string

	// Clock, when set, is the journal's clock instead of the database's
	// now(): the time it stamps on entries and outcomes given without one,
	// the time leases are reckoned by, and what [Journal.Now] returns.
	// Every Journal of a fleet must then share it. Tests that simulate
	// time set it; nil, for production, means the database's clock, one
	// clock for the whole fleet however far the workers' clocks drift.
	Clock func() time.Time
}

// ErrLeaseLost is returned, wrapped in a [*LeaseLostError], when another
// worker holds the entry: by [Journal.Finish] while another worker's lease
// on it is live (this worker's lease expired and the entry was claimed
// again), by [Journal.Renew] once this Journal no longer holds the lease,
// and by [Journal.Delete] once another worker has claimed or begun the
// entry, live lease or not. The worker must stop working on the entry;
// the holder resends it with the same key. It wraps [idemhttp.ErrFenced],
// so a Client treats it as every other fenced write.
var ErrLeaseLost = fmt.Errorf("idemhttp/postgres: lease lost: %w", idemhttp.ErrFenced)

// LeaseLostError says which entry's lease was lost, and to whom.
type LeaseLostError struct {
	Key   string // the entry's key
	Owner string // the worker now holding a live lease on it, or "" if none does
}

// Error says which entry's lease was lost, and to whom.
func (e *LeaseLostError) Error() string {
	if e.Owner == "" {
		return "idemhttp/postgres: lease lost on entry " + e.Key
	}
	return "idemhttp/postgres: lease lost on entry " + e.Key + " (now held by " + e.Owner + ")"
}

// Unwrap returns [ErrLeaseLost], which wraps [idemhttp.ErrFenced].
func (e *LeaseLostError) Unwrap() error { return ErrLeaseLost }

var _ idemhttp.Journal = (*Journal)(nil)

// JournalSenders declares to [idemhttp.Client] that the journal is
// shared by a fleet: the Clients of this process share their senders'
// slots on it (through any wrappers that implement Unwrap, see
// [idemhttp.Journal]), and other processes' writes are fenced by leases.
// A key minted for a call is not the call's alone (another worker may
// send under it the moment Begin returns), so a 409 to its first attempt
// is waited out as a request in progress. The result's type is internal
// to idemhttp: only the project's own journals declare it.
func (j *Journal) JournalSenders() contract.Senders {
	return contract.Senders{Store: j}
}

// Journal is an [idemhttp.Journal] in the idemhttp_journal table, shared by
// a fleet of worker processes that work through one batch. Every write is
// committed (and, with PostgreSQL's default synchronous_commit, on the
// primary's disk) before the method returns.
//
// Besides the [idemhttp.Journal] methods, which [idemhttp.Client] calls, a
// Journal leases pending entries to workers: [Journal.Begin] leases the
// entry it writes, or the pending entry it finds, to its own worker;
// [Journal.Enqueue] writes an entry no one holds; and
// [Journal.ClaimPending] leases the oldest pending entries that no live
// lease holds, with SELECT ... FOR UPDATE SKIP LOCKED, so concurrent
// workers never claim the same entry at once. A worker that dies leaves
// its entries pending; when their leases expire another worker claims
// them and resends them with the same key, and the server replays or runs
// them once. See the package documentation for the worker loop.
//
// Writes are fenced, so that a stale worker never removes, revives or
// overwrites an entry another worker holds or has finished: see
// [Journal.Finish], [Journal.Delete] and [Journal.Renew]. Every refusal
// wraps [idemhttp.ErrFenced].
//
// One clock ages the entries of the whole fleet: the database's (or
// [JournalOptions.Clock]). [Journal.Now] returns it, and a Client, seeing
// Now, ages entries by it and leaves their times for the journal to stamp.
//
// Entries never hold what [idemhttp.Entry.Sanitized] removes (the
// Authorization, Cookie and Proxy-Authorization headers, API keys under
// their common names, the headers [JournalOptions.SecretHeaders] names, a
// URL's fragment), and an entry whose URL carries credentials (a user
// part, a secret query value) is refused, whatever way it comes in; the
// headers a Client's SecretHeaders names never reach the journal. A kept
// result holds what [idemhttp.Outcome.Sanitized] keeps, the rule every
// journal applies.
//
// A Journal is safe for concurrent use. Create it with [NewJournal] after
// [Migrate] has created the tables.
type Journal struct {
	db         DB
	worker     string
	token      string // this Journal's leases, unique even when worker names are not
	lease      time.Duration
	retention  atomic.Int64 // the longest Policy.Retention a Client told it (Retain); 0: none yet
	omitBodies bool
	secrets    []string         // JournalOptions.SecretHeaders
	clock      func() time.Time // nil: the database's now()

	mu     sync.Mutex
	seen   time.Time   // the latest time this Journal recorded
	stored time.Time   // the latest mark it knows idemhttp_journal_clock holds
	last   clockSample // read with the last entry Begin found
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
		secrets:    slices.Clone(opts.SecretHeaders),
		clock:      opts.Clock,
		token:      newLeaseToken(),
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

// Retain tells the journal the retention of the Client that uses it
// ([idemhttp.Policy.Retention]), as an [idemhttp.Client] does at its first
// call: [Journal.ClaimPending] then abandons, instead of handing out,
// entries older than the longest retention it was told. A d that is not
// positive is ignored.
func (j *Journal) Retain(d time.Duration) {
	for {
		cur := j.retention.Load()
		if int64(d) <= cur || j.retention.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// Worker returns the name this journal writes as the lease owner.
func (j *Journal) Worker() string { return j.worker }

// now is the argument every statement reckons time by: NULL for the
// database's now(), or the injected clock's reading. See sqlNow.
func (j *Journal) now() *time.Time {
	if j.clock == nil {
		return nil
	}
	t := j.clock()
	return &t
}

// sqlNow replaces {now} in a statement with the journal's clock: the
// parameter $n when the Journal has a Clock, else the database's now()
// (the start of the statement's transaction).
func sqlNow(sql string, n int) string {
	return strings.ReplaceAll(sql, "{now}", "coalesce($"+strconv.Itoa(n)+"::timestamptz, now())")
}

// entryColumns lists the columns scanEntry reads, in its order, each
// qualified with table (an alias and a dot, or ""); with result, the
// kept response too.
func entryColumns(table string, result bool) string {
	cols := fmt.Sprintf(`%[1]skey, coalesce(%[1]soperation, ''), %[1]smethod, %[1]surl, %[1]sheader,
    %[1]sbody, %[1]sfingerprint, %[1]screated_at, %[1]supdated_at, %[1]sattempts, %[1]slast_status, %[1]sstate,
    %[1]snot_before`, table)
	if result {
		cols += ", " + table + "result"
	}
	return cols
}

// beginSQL inserts an entry unless its key or operation is taken. Its
// times are the ones given, but never later than the journal's clock, or
// that clock when none is given ($8 and $9 NULL: a Client's call); the
// lease, when there is an owner, ends Lease from the clock. It returns
// the latest time it recorded, for the high-water mark.
var beginSQL = sqlNow(`
INSERT INTO idemhttp_journal (key, operation, method, url, header, body, fingerprint, state,
    created_at, updated_at, attempts, last_status, lease_owner, lease_token, lease_expires_at, not_before)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', least($8::timestamptz, {now}), least($9::timestamptz, {now}), $10, $11, $12,
    CASE WHEN $12::text IS NULL THEN NULL ELSE $14 END,
    CASE WHEN $12::text IS NULL THEN NULL ELSE {now} + $13::interval END, $16)
ON CONFLICT DO NOTHING
RETURNING greatest(created_at, updated_at)`, 15)

// existingSQL reads the entry beginSQL conflicted with: the operation's
// when there is one, else the key's.
var existingSQL = "SELECT " + entryColumns("", true) + ` FROM idemhttp_journal
WHERE key = $1 OR operation = $2
ORDER BY operation IS NOT DISTINCT FROM $2 DESC
LIMIT 1`

// takeSQL is existingSQL for Begin: besides reading the entry, it leases
// it to this Journal when it is pending with the same fingerprint and
// another (or no) Journal's token, and not parked past the journal's
// clock (a Client refuses to send that one: no lease for it): the caller
// is about to send it, and a
// worker that created it or claimed it earlier must no longer withdraw it
// (Delete) nor, while this lease lasts, record its outcome. The row
// returned is the one read before the lease changed, which only the lease
// columns, not read, tell apart. On Begin's insert path it finds the new
// row, already this Journal's, and writes nothing. With the entry come the
// journal's clock and high-water mark, which a Client asks for next (see
// clockSample).
//
// Last comes missed: the entry read was one to lease, and the lease
// matched no row. The row changed between the statement's snapshot and
// its lock: another worker finished or parked it, or its creator
// withdrew it (Delete, whose lock the lease waited for). The entry read
// is then stale, and a withdrawn one must never be sent: its creator told
// its caller nothing ran, and the caller's retry mints a new key. Begin
// reads again.
var takeSQL = sqlNow(`
WITH e AS (`+existingSQL+`),
tok AS (SELECT lease_token FROM idemhttp_journal WHERE key = (SELECT key FROM e)),
took AS (
    UPDATE idemhttp_journal j SET lease_owner = $3, lease_token = $4, lease_expires_at = {now} + $5::interval
    FROM e
    WHERE j.key = e.key AND j.state = 'pending' AND j.fingerprint = $6 AND j.lease_token IS DISTINCT FROM $4
        AND (j.not_before IS NULL OR j.not_before <= {now})
    RETURNING j.key)
SELECT e.*, {now}, (SELECT high FROM idemhttp_journal_clock WHERE id = 1),
    e.state = 'pending' AND e.fingerprint = $6 AND (SELECT lease_token FROM tok) IS DISTINCT FROM $4
        AND (e.not_before IS NULL OR e.not_before <= {now}) AND NOT EXISTS (SELECT 1 FROM took)
FROM e`, 7)

// beginAttempts bounds Begin's retries when the entry it conflicted with
// vanishes before it can be read (a concurrent Prune or Delete), or
// changes before it can be leased; two would do.
const beginAttempts = 5

// Begin implements [idemhttp.Journal.Begin]. The entry stored is what
// [idemhttp.Entry.Sanitized] returns for e, without the body when
// OmitBodies is set; its Created and Updated times are the journal's
// clock when e has none (a Client's call: it leaves them to a journal with
// a clock), else e's own, but never later than the clock (a producer's
// clock that runs ahead cannot date an entry in the journal's future).
// It is leased to this journal's worker for its Lease, so that no other
// worker resends it while this one is sending it. e is not modified.
//
// When Begin finds the entry instead (an operation run again, or an entry
// claimed and being resent) and it is pending with e's fingerprint, Begin
// leases it to this worker too, whoever held it: the caller is about to
// send it, so the worker that created it must no longer withdraw it
// ([Journal.Delete]), and one that held it gets [ErrLeaseLost] for its
// outcome while this lease lasts. The entry returned carries its Result.
//
// Begin fails with an error wrapping [idemhttp.ErrInvalidKey] or
// [idemhttp.ErrInvalidRequest] for a bad key or operation id, a URL with
// credentials, and for a method, URL or header that is not valid UTF-8 (a
// jsonb or text column would alter it), before touching the database.
func (j *Journal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	return j.begin(ctx, e, true)
}

// Enqueue records e as pending like [Journal.Begin], but leases it to no
// one, so that the next [Journal.ClaimPending] of any worker may take it at
// once. A producer uses it to load a batch that a fleet of workers then
// works through; the entry must hold the request (Key, Method, URL, Header
// and Body) so that a worker can send it; Sanitized fills in its
// Fingerprint. Leave Created zero for the journal's clock to stamp it (a
// time given, for entries moved from another journal, is kept, as an
// earlier age is the safe side). Like Begin, it returns the existing
// entry for e.Operation or e.Key instead of writing, if there is one, and
// refuses what Begin refuses.
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
	var created, updated *time.Time // NULL: the journal's clock
	if !rec.Created.IsZero() {
		created, updated = &rec.Created, &rec.Updated
	}
	notBefore := timeOrNull(rec.NotBefore) // a producer's: send after then
	for range beginAttempts {
		var (
			existing *idemhttp.Entry
			stamped  time.Time
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
			// loop tries again. The second statement has a snapshot of its
			// own, which sees the row the insert conflicted with even when
			// its writer committed after the insert began.
			b := &pgx.Batch{}
			now := j.now()
			b.Queue(beginSQL, rec.Key, op, rec.Method, rec.URL, header, rec.Body, rec.Fingerprint,
				created, updated, rec.Attempts, rec.LastStatus, leaseOwner, lease, j.token, now, notBefore)
			if leased {
				b.Queue(takeSQL, rec.Key, op, j.worker, j.token, j.lease, rec.Fingerprint, now)
			} else {
				b.Queue(existingSQL, rec.Key, op)
			}
			br := j.db.SendBatch(ctx, b)
			var err error
			existing, stamped, inserted, err = j.readBegin(br, leased)
			if cerr := br.Close(); err == nil && cerr != nil {
				err = cerr
			}
			return err
		})
		switch {
		case err != nil:
			return nil, fmt.Errorf("idemhttp/postgres: journal begin %s: %w", rec.Key, err)
		case inserted:
			j.recorded(ctx, stamped)
			return nil, nil
		case existing != nil:
			return existing, nil
		}
	}
	return nil, fmt.Errorf("idemhttp/postgres: journal begin %s: the conflicting entry kept vanishing", rec.Key)
}

// readBegin reads Begin's pipeline: inserted, with the time it recorded,
// or the existing entry, or neither when the conflicting entry vanished
// or changed before takeSQL could lease it.
// taken says the second statement is takeSQL, whose clock sample it keeps.
func (j *Journal) readBegin(br pgx.BatchResults, taken bool) (existing *idemhttp.Entry, stamped time.Time, inserted bool, err error) {
	switch err := br.QueryRow().Scan(&stamped); {
	case err == nil:
		return nil, stamped, true, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, time.Time{}, false, err
	}
	var (
		now    time.Time
		mark   *time.Time
		missed bool // takeSQL's: the entry changed before it could be leased
	)
	var extra []any
	if taken {
		extra = []any{&now, &mark, &missed}
	}
	e, err := scanEntry(br.QueryRow(), true, extra...)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && missed) {
		return nil, time.Time{}, false, nil // read again
	}
	if err == nil && taken {
		j.sample(now, mark)
	}
	return e, time.Time{}, false, err
}

// sanitize returns the entry to store and its header as JSON, or an error
// for an entry the table cannot hold faithfully. What may be stored at all
// is [idemhttp.Entry.Sanitized]'s rule, shared with every journal.
func (j *Journal) sanitize(e *idemhttp.Entry) (*idemhttp.Entry, []byte, error) {
	rec, err := e.Sanitized(j.secrets...)
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

// scanEntry reads one row of entryColumns(_, result), followed by the
// columns extra points to.
func scanEntry(row pgx.Row, result bool, extra ...any) (*idemhttp.Entry, error) {
	var (
		e         idemhttp.Entry
		header    []byte
		state     string
		res       []byte
		notBefore *time.Time
	)
	dest := []any{&e.Key, &e.Operation, &e.Method, &e.URL, &header, &e.Body, &e.Fingerprint,
		&e.Created, &e.Updated, &e.Attempts, &e.LastStatus, &state, &notBefore}
	if result {
		dest = append(dest, &res)
	}
	dest = append(dest, extra...)
	if err := row.Scan(dest...); err != nil {
		return nil, err
	}
	e.State = idemhttp.State(state)
	if notBefore != nil && e.State == idemhttp.StatePending {
		e.NotBefore = *notBefore
	}
	if err := json.Unmarshal(header, &e.Header); err != nil {
		return nil, fmt.Errorf("entry %s: header: %w", e.Key, err)
	}
	if len(e.Header) == 0 {
		e.Header = nil
	}
	if res != nil {
		r, err := decodeResult(res)
		if err != nil {
			return nil, fmt.Errorf("entry %s: result: %w", e.Key, err)
		}
		e.Result = r
	}
	return &e, nil
}

// finishSQL records an outcome where the fence allows it: on a pending
// entry that no other Journal's live lease holds, or, adding attempts
// only, on a final entry in the outcome's own state (a second sender that
// got the replay). A definite outcome ends the lease; a pending one keeps
// it, so the entry waits for the lease to expire before another worker
// retries it. $6 is this Journal's token. It returns the entry's Updated
// time, for the high-water mark. A statement that changes no row is
// explained by explain.
var finishSQL = sqlNow(`
UPDATE idemhttp_journal SET
    attempts = attempts + $2,
    last_status = CASE WHEN state = 'pending' THEN $4 ELSE last_status END,
    updated_at = CASE WHEN state = 'pending' THEN least($5::timestamptz, {now}) ELSE updated_at END,
    result = CASE WHEN state = 'pending' AND $3 = 'done' THEN $7 ELSE result END,
    not_before = CASE WHEN state = 'pending' THEN $9::timestamptz ELSE not_before END,
    lease_owner = CASE WHEN $3 = 'pending' THEN lease_owner END,
    lease_token = CASE WHEN $3 = 'pending' THEN lease_token END,
    lease_expires_at = CASE WHEN $3 = 'pending' THEN lease_expires_at END,
    state = $3
WHERE key = $1 AND (
    (state = 'pending' AND NOT (lease_token IS DISTINCT FROM $6 AND coalesce(lease_expires_at > {now}, false)))
    OR (state <> 'pending' AND state = $3 AND $2 > 0))
RETURNING updated_at`, 8)

// timeOrNull is t for a statement, NULL for the zero Time.
func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Finish implements [idemhttp.Journal.Finish]: it adds o.Attempts to the
// entry's attempts and sets its state, last status, Updated time (o.At,
// or the journal's clock when zero, and never later than the clock) and,
// for done, its Result, as [idemhttp.Outcome.Sanitized] returns them. A
// definite outcome (done or abandoned) ends the entry's lease; a pending
// one keeps it, so the entry waits for the lease to expire before another
// worker retries it.
//
// Finish is fenced. While another worker (another Journal) holds a live
// lease on a pending entry, it changes nothing and returns a
// [*LeaseLostError] (errors.Is [ErrLeaseLost] and [idemhttp.ErrFenced]):
// this worker's lease expired and the entry was claimed again, or another
// caller began it, so the holder's outcome is the one that counts. A
// lease that expired without being claimed again does not stop Finish.
// Done and abandoned are final: an outcome in the other state changes
// nothing and returns an error wrapping [idemhttp.ErrFenced]; one in the
// same state only adds its attempts. Otherwise a stale worker's pending
// or abandoned could hide a done entry, or revive an abandoned one that
// the next claim would hand out.
//
// Finish returns an error wrapping [idemhttp.ErrNotFound] for an unknown
// key and [idemhttp.ErrInvalidRequest] for an unknown state.
func (j *Journal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	o, err := o.Sanitized()
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal finish %s: %w", key, err)
	}
	var at *time.Time // NULL: the journal's clock
	if !o.At.IsZero() {
		at = &o.At
	}
	var result []byte
	if o.State == idemhttp.StateDone {
		result = encodeResult(o.Result)
	}
	return j.fenced(ctx, "finish", key, &o, func() (bool, error) {
		// Sent again after a dead connection, a Finish whose first try
		// committed after all counts its attempts twice; nothing else
		// changes.
		var updated time.Time
		err := retry(ctx, func() error {
			return j.db.QueryRow(ctx, finishSQL, key, o.Attempts, string(o.State), o.Status, at, j.token, result, j.now(), timeOrNull(o.NotBefore)).Scan(&updated)
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		j.recorded(ctx, updated)
		return true, nil
	})
}

// fencedAttempts bounds how often a fenced write is tried again when the
// row changed between the write, which matched nothing, and explain,
// which found the write allowed after all (a lease expiring in between).
const fencedAttempts = 4

// fenced runs write, a statement fenced in its WHERE clause, until it
// reports that it changed the row, or explain says why it may not: the
// entry is unknown, final, or another Journal's. o is the outcome of a
// Finish, nil for the other writes.
func (j *Journal) fenced(ctx context.Context, op, key string, o *idemhttp.Outcome, write func() (bool, error)) error {
	for range fencedAttempts {
		ok, err := write()
		if err != nil {
			return fmt.Errorf("idemhttp/postgres: journal %s %s: %w", op, key, err)
		}
		if ok {
			return nil
		}
		switch why := j.explain(ctx, op, key, o); {
		case why == errUnchanged:
			return nil
		case why != nil:
			return why
		}
	}
	return fmt.Errorf("idemhttp/postgres: journal %s %s: %w: the entry kept changing", op, key, idemhttp.ErrFenced)
}

// errUnchanged is explain's verdict for a Finish in the final entry's own
// state with no attempts to add: there was nothing to change.
var errUnchanged = errors.New("unchanged")

// explain says why a fenced write to key changed nothing: the reason (the
// entry is unknown, final, or another Journal's; the error reading it),
// errUnchanged, or nil when the write is allowed after all (the row
// changed in between) and may go again.
func (j *Journal) explain(ctx context.Context, op, key string, o *idemhttp.Outcome) error {
	var (
		state    string
		owner    *string
		mine     bool // this Journal's token is on the entry
		other    bool // another Journal's token is on it
		leased   bool // another's live lease holds it
		attempts int
	)
	err := retry(ctx, func() error {
		return j.db.QueryRow(ctx, explainSQL, key, j.token, j.now()).Scan(&state, &owner, &mine, &other, &leased, &attempts)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("idemhttp/postgres: journal %s %s: %w", op, key, idemhttp.ErrNotFound)
	case err != nil:
		return fmt.Errorf("idemhttp/postgres: journal %s %s: %w", op, key, err)
	}
	lost := func() error {
		l := &LeaseLostError{Key: key}
		if leased && owner != nil {
			l.Owner = *owner
		}
		return fmt.Errorf("idemhttp/postgres: journal %s: %w", op, l)
	}
	final := func() error {
		return fmt.Errorf("idemhttp/postgres: journal %s %s: %w: the entry is %s", op, key, idemhttp.ErrFenced, state)
	}
	pending := state == string(idemhttp.StatePending)
	switch op {
	case "finish":
		switch {
		case !pending && state == string(o.State):
			if o.Attempts == 0 {
				return errUnchanged
			}
		case !pending:
			return final()
		case leased:
			return lost()
		}
	case "renew":
		if !pending || !mine {
			return lost()
		}
	case "delete":
		switch {
		case !pending:
			return final()
		case other:
			return lost()
		case !mine:
			return fmt.Errorf("idemhttp/postgres: journal delete %s: %w: no worker holds the entry: it is not this one's to withdraw", key, idemhttp.ErrFenced)
		case attempts > 0:
			return fmt.Errorf("idemhttp/postgres: journal delete %s: %w: %d attempts are recorded", key, idemhttp.ErrFenced, attempts)
		}
	case "forget":
		switch {
		case state == string(idemhttp.StateDone):
			return final()
		case pending && leased:
			return lost()
		}
	}
	return nil
}

// explainSQL reads what explain needs of key's row: its state and lease
// owner, whether this Journal's token ($2), another's, or another's
// live lease is on it, and its attempts.
var explainSQL = sqlNow(`
SELECT state, lease_owner, lease_token IS NOT DISTINCT FROM $2, lease_token IS NOT NULL AND lease_token <> $2,
    lease_token IS NOT NULL AND lease_token <> $2 AND coalesce(lease_expires_at > {now}, false), attempts
FROM idemhttp_journal WHERE key = $1`, 3)

// releaseSQL ends the lease of key $1, pending and held by token $2, and
// changes nothing else.
const releaseSQL = `
UPDATE idemhttp_journal SET lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE key = $1 AND state = 'pending' AND lease_token = $2`

// Release hands back a pending entry this Journal leased (claimed or
// began) and will not send: it ends the lease and changes nothing else,
// neither the entry's state, last status, attempts nor Updated time, so
// that any worker may claim it at once. (A Finish with an outcome of
// pending keeps the lease and records a last status: it is for an entry
// that was sent.) It returns nil when the entry is this Journal's no
// longer (its lease expired and another worker claimed it, or it was
// finished): there was nothing to hand back. It returns an error wrapping
// [idemhttp.ErrNotFound] for an unknown key.
func (j *Journal) Release(ctx context.Context, key string) error {
	var n int64
	err := retry(ctx, func() error {
		tag, err := j.db.Exec(ctx, releaseSQL, key, j.token)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: journal release %s: %w", key, err)
	}
	if n == 0 {
		if _, err := j.Get(ctx, key); errors.Is(err, idemhttp.ErrNotFound) {
			return fmt.Errorf("idemhttp/postgres: journal release %s: %w", key, idemhttp.ErrNotFound)
		}
	}
	return nil
}

// renewSQL extends the lease of key $1, pending and held by token $2, to
// $3 from the journal's clock.
var renewSQL = sqlNow(`
UPDATE idemhttp_journal SET lease_expires_at = {now} + $3::interval
WHERE key = $1 AND state = 'pending' AND lease_token = $2`, 4)

// Renew extends this worker's lease on a pending entry to Lease from now
// (by the journal's clock), for a worker still busy with it as its lease
// nears its end. It returns a [*LeaseLostError] (errors.Is [ErrLeaseLost]
// and [idemhttp.ErrFenced]) when this Journal no longer holds the lease:
// another worker claimed or began the entry, or the entry was finished.
// Then the worker must stop: someone else now owns the entry. An unknown
// key returns an error wrapping [idemhttp.ErrNotFound].
func (j *Journal) Renew(ctx context.Context, key string) error {
	return j.fenced(ctx, "renew", key, nil, func() (bool, error) {
		var tag pgconn.CommandTag
		err := retry(ctx, func() (err error) {
			tag, err = j.db.Exec(ctx, renewSQL, key, j.token, j.lease, j.now())
			return err
		})
		return tag.RowsAffected() == 1, err
	})
}

// getSQL reads key $1's entry with its Result.
var getSQL = "SELECT " + entryColumns("", true) + " FROM idemhttp_journal WHERE key = $1"

// Get implements [idemhttp.Journal.Get]: the entry with its request and,
// when done, its Result.
func (j *Journal) Get(ctx context.Context, key string) (*idemhttp.Entry, error) {
	var e *idemhttp.Entry
	err := retry(ctx, func() (err error) {
		e, err = scanEntry(j.db.QueryRow(ctx, getSQL, key), true)
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

// lookupOperationSQL reads operation $1's entry without its Result. (Not
// lookupSQL: that is the Store's.)
var lookupOperationSQL = "SELECT " + entryColumns("", false) + " FROM idemhttp_journal WHERE operation = $1"

// Lookup implements [idemhttp.Journal.Lookup]: the entry for operation,
// with its request but without its Result, in one query.
func (j *Journal) Lookup(ctx context.Context, operation string) (*idemhttp.Entry, error) {
	var e *idemhttp.Entry
	err := retry(ctx, func() (err error) {
		e, err = scanEntry(j.db.QueryRow(ctx, lookupOperationSQL, operation), false)
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

// pendingSQL reads every pending entry without its Result, oldest first.
var pendingSQL = "SELECT " + entryColumns("", false) + " FROM idemhttp_journal WHERE state = 'pending' ORDER BY created_at, key"

// Pending implements [idemhttp.Journal.Pending]: every pending entry,
// oldest Created first (ties in key order), leased or not. A fleet's
// workers use [Journal.ClaimPending] instead; [idemhttp.Client.Resume]
// without Entries, which calls Pending, would resend entries other
// workers are sending.
func (j *Journal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	out, err := j.query(ctx, pendingSQL)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/postgres: journal pending: %w", err)
	}
	return out, nil
}

// claimPendingSQL leases up to $1 of the oldest pending entries that no live
// lease holds. MATERIALIZED keeps the locking subquery from being inlined
// and run more than once. The UPDATE rechecks the lease after locking: a
// row another worker leased between the snapshot and the lock is skipped.
// A parked row (not_before) is skipped until its time, unless it is past
// the retention. A row older than the retention ($6) by the journal's
// clock is marked abandoned instead of leased (abandon, worked out once per row in free:
// created_at never changes, and the row is locked from then on). Nothing
// is claimed when the clock is more than the tolerance ($8) below the
// high-water mark (the stored one, or $7, this Journal's own): every
// entry's age is then in doubt. Keys in $9 are skipped
// (ClaimPendingExcept).
var claimPendingSQL = sqlNow(`
WITH free AS MATERIALIZED (
    SELECT key, created_at < {now} - $6::interval AS abandon FROM idemhttp_journal
    WHERE state = 'pending' AND (lease_expires_at IS NULL OR lease_expires_at <= {now})
        AND (not_before IS NULL OR not_before <= {now} OR created_at < {now} - $6::interval)
        AND coalesce(greatest((SELECT high FROM idemhttp_journal_clock WHERE id = 1), $7::timestamptz) <= {now} + $8::interval, true)
        AND NOT key = ANY($9::text[])
    ORDER BY created_at, key
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
UPDATE idemhttp_journal j SET
    state = CASE WHEN free.abandon THEN 'abandoned' ELSE 'pending' END,
    updated_at = CASE WHEN free.abandon THEN {now} ELSE j.updated_at END,
    lease_owner = CASE WHEN free.abandon THEN NULL ELSE $2 END,
    lease_token = CASE WHEN free.abandon THEN NULL ELSE $4 END,
    lease_expires_at = CASE WHEN free.abandon THEN NULL ELSE {now} + $3::interval END
FROM free
WHERE j.key = free.key AND j.state = 'pending'
    AND (j.lease_expires_at IS NULL OR j.lease_expires_at <= {now})
RETURNING `+entryColumns("j.", false), 5)

// ClaimPending leases up to limit pending entries that no live lease holds
// (never leased, or their lease expired) to this journal's worker for its
// Lease, and returns them oldest Created first. Concurrent calls, in any
// process, never return the same entry while its lease lasts: each skips
// the rows the others have locked (FOR UPDATE SKIP LOCKED) instead of
// waiting for them. An empty result means no entry is free now; entries
// leased by live workers may still be pending.
//
// It never hands out an entry older than the retention a Client told the
// journal ([Journal.Retain]: the Client's [idemhttp.Policy.Retention], the
// one retention setting) by the journal's clock: the server may have
// forgotten its key, and a resend could run the operation twice. Such an
// entry, when its turn comes, is marked abandoned (as
// [idemhttp.Client.Resume] marks one) for a person or a reconciliation
// step to resolve, and is not returned. Before any Client told it (a
// worker that claims before its Client's first call), it hands every
// entry out, and the Client's Resume abandons those past its retention; list them
// with SELECT ... FROM idemhttp_journal WHERE state = 'abandoned'. When
// the clock is more than [idemhttp.ClockTolerance] below the latest time
// the journal ever recorded ([Journal.HighWater]), it was set back and no
// entry's age is known: ClaimPending claims nothing and returns an error
// wrapping [idemhttp.ErrClockJump]. Once the clock is past that mark
// again, the set-back stays the journal's doubt ([Journal.ClockDoubt]):
// an entry created at or before it is of unknown age, and ClaimPending
// hands it out all the same, for the Client refuses to resend it
// ([idemhttp.ErrClockJump], the entry left pending for a person). A
// sender of its own must check ClockDoubt before it resends a claimed
// entry.
//
// Nor does it hand out a parked entry (one whose [idemhttp.Entry.NotBefore]
// the server's Retry-After set, when a call parked the operation) before
// that time by the journal's clock: the server asked to be left alone
// until then. Past the retention it is abandoned as any other.
//
// Send each entry with its own key, operation and body (see the package
// documentation); its outcome, recorded through [Journal.Finish], ends the
// lease. limit must be positive.
func (j *Journal) ClaimPending(ctx context.Context, limit int) ([]*idemhttp.Entry, error) {
	return j.ClaimPendingExcept(ctx, limit, nil)
}

// ClaimPendingExcept is [Journal.ClaimPending] skipping the entries whose
// keys are in except: for a worker that sends only some of a shared
// journal's entries (idemctl batch sends its input's), which hands the
// others back with [Journal.Release] and must not claim them again ahead
// of its own.
func (j *Journal) ClaimPendingExcept(ctx context.Context, limit int, except []string) ([]*idemhttp.Entry, error) {
	if except == nil {
		except = []string{} // NOT key = ANY(NULL) would skip every key
	}
	if limit <= 0 {
		return nil, fmt.Errorf("idemhttp/postgres: claim pending: %w: limit %d", idemhttp.ErrInvalidRequest, limit)
	}
	var out []*idemhttp.Entry
	for len(out) < limit {
		retention := time.Duration(j.retention.Load())
		if retention <= 0 {
			// No Client told it yet: hand every entry out, and let the
			// Client's own check (with the journal's clock) abandon those
			// past its retention. Abandoning at a guess could give up on
			// entries the server still remembers.
			retention = 100 * 365 * 24 * time.Hour
		}
		rows, err := j.query(ctx, claimPendingSQL, limit-len(out), j.worker, j.lease, j.token, j.now(), retention, j.seenMark(), idemhttp.ClockTolerance, except)
		if err != nil {
			return nil, fmt.Errorf("idemhttp/postgres: claim pending: %w", err)
		}
		abandoned := 0
		for _, e := range rows {
			if e.State == idemhttp.StatePending {
				out = append(out, e)
				continue
			}
			abandoned++
			j.recorded(ctx, e.Updated)
		}
		if len(rows) == 0 && len(out) == 0 {
			if err := j.clockBack(ctx); err != nil {
				return nil, err
			}
		}
		// Rows marked abandoned took places in the limit: claim again
		// for them. Each round abandons at least one, so this ends.
		if abandoned == 0 {
			break
		}
	}
	slices.SortFunc(out, func(a, b *idemhttp.Entry) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return out, nil
}

// query runs a statement that returns entries without their Result. Sent
// again after a dead connection, a ClaimPending whose first try committed
// after all leaves those entries leased until their lease expires: a
// delay, not a loss.
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
		e, err := scanEntry(rows, false)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Prune implements [idemhttp.Journal.Prune]. Pending and abandoned entries
// are never pruned. The latest time among the entries it deletes raises
// the high-water mark, so that it outlives them. Nothing prunes the table
// by itself (a Client's Resume leaves a journal that was told its
// retention to prune its own): run it from one worker, or a scheduled job,
// with a cutoff no later than the clients' Policy.Retention ago by the
// journal's clock ([Journal.Now]), or later for reruns that may come after
// the server has forgotten the keys.
func (j *Journal) Prune(ctx context.Context, cutoff time.Time) (int, error) {
	var n int
	err := retry(ctx, func() error {
		return j.db.QueryRow(ctx, `
WITH d AS (DELETE FROM idemhttp_journal WHERE state = 'done' AND updated_at < $1
    RETURNING greatest(created_at, updated_at) AS t)`+raiseFromDeleted+`
SELECT count(*) FROM d`, cutoff, j.seenMark()).Scan(&n)
	})
	j.unsample()
	if err != nil {
		return 0, fmt.Errorf("idemhttp/postgres: journal prune: %w", err)
	}
	return n, nil
}

// deleteSQL withdraws a pending entry this Journal holds ($3, its token:
// it began it, or took it back since, and nobody took it after) with no
// attempt recorded. Not an abandoned one, nor one nobody holds (issue 32's
// bugFleetExpiredRerun: a call's withdrawal after another worker sent the
// entry and a third abandoned it, which ended every lease, let a rerun
// begin the operation afresh under a new key).
var deleteSQL = `
WITH d AS (DELETE FROM idemhttp_journal
    WHERE key = $1 AND state = 'pending' AND lease_token = $3 AND attempts = 0
    RETURNING greatest(created_at, updated_at) AS t)` + raiseFromDeleted + `
SELECT count(*) FROM d`

// Delete implements [idemhttp.Journal.Delete]: it withdraws key's pending
// entry, or returns an error wrapping [idemhttp.ErrNotFound].
//
// It is fenced, and removes only an entry this Journal holds and nobody
// sent: a final entry is refused, done (only Prune forgets those, after
// the retention) or abandoned (it keeps its operation's key: another
// worker may have sent it before it was abandoned; [Journal.Forget]
// removes it once a person resolved it), and so is a pending entry that
// another Journal has claimed or begun since this one wrote it, live lease
// or expired, with a [*LeaseLostError] (errors.Is [ErrLeaseLost] and
// [idemhttp.ErrFenced]): that worker may have sent it, and withdrawing it
// would make the caller's retry a second operation; and so is one nobody
// holds (enqueued, or its lease released) or with an attempt recorded. A
// Client deletes only an entry its own call began and provably never
// sent. The entry's times raise the high-water mark.
//
// A worker of the release before this one (commit 2d053bb) sharing the
// table still withdraws by key alone, whatever the entry's state or lease:
// an abandoned entry, one nobody holds, and also one a new worker leased
// and sent, or finished. Its Client does so only for a call that stopped
// before its first attempt (a PrepareRequest error); should that call
// stall past its lease while another worker claims and sends the entry,
// its caller is told nothing ran. Nor does an old worker's Begin take the
// lease of a pending entry it finds (an operation it runs again): it
// sends the entry under its key with this Journal's token still on it, so
// this Journal's own withdrawal, after a dial refused, removes what the
// old worker is sending. Until every worker runs this release, a call of
// either can reopen an operation under a new key.
func (j *Journal) Delete(ctx context.Context, key string) error {
	defer j.unsample() // it may have raised the mark
	return j.fenced(ctx, "delete", key, nil, func() (bool, error) {
		var n int
		err := retry(ctx, func() error {
			return j.db.QueryRow(ctx, deleteSQL, key, j.seenMark(), j.token).Scan(&n)
		})
		return n == 1, err
	})
}

// forgetSQL removes an abandoned entry, or a pending one no other
// Journal's live lease holds.
var forgetSQL = sqlNow(`
WITH d AS (DELETE FROM idemhttp_journal
    WHERE key = $1 AND (state = 'abandoned' OR (state = 'pending' AND (lease_token IS NULL OR lease_token = $3
        OR lease_expires_at IS NULL OR lease_expires_at <= {now})))
    RETURNING greatest(created_at, updated_at) AS t)`+raiseFromDeleted+`
SELECT count(*) FROM d`, 4)

// Forget removes key's abandoned entry, or its pending one that no other
// Journal's live lease holds (a [*LeaseLostError] then): an operator's
// act, for an entry a person has resolved (see journaltest.Forgetter).
// It returns an error wrapping [idemhttp.ErrNotFound] for an unknown key,
// and one wrapping [idemhttp.ErrFenced] for a done entry, which only
// Prune removes. A Client never calls it. Forgetting an entry forgets an
// operation whose outcome is unknown, or that may have run: a rerun of it
// mints a new key. The entry's times raise the high-water mark.
func (j *Journal) Forget(ctx context.Context, key string) error {
	defer j.unsample() // it may have raised the mark
	return j.fenced(ctx, "forget", key, nil, func() (bool, error) {
		var n int
		err := retry(ctx, func() error {
			return j.db.QueryRow(ctx, forgetSQL, key, j.seenMark(), j.token, j.now()).Scan(&n)
		})
		return n == 1, err
	})
}
