package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A -journal of the form postgres://... is the journal a fleet shares
// (contrib/postgres): every idemctl batch (or resume) given it, on any
// machine, loads the input's operations as pending entries (Enqueue: the
// first to load an operation decides its entry, the others find it) and
// then works through them with ClaimPending, which leases each entry to
// one worker at a time (FOR UPDATE SKIP LOCKED). So each operation is sent
// by one worker; a worker that dies leaves its entries leased until the
// lease ends (-lease), and another then resends them with their keys.

// isPostgresURL reports whether -journal names a PostgreSQL database.
func isPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// redactDSN returns the database URL for messages: no password, no query
// (which may hold one too).
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	u.RawQuery, u.Fragment = "", ""
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	return u.String()
}

// fleetFlags are the settings of a shared journal.
type fleetFlags struct {
	worker string
	lease  time.Duration
}

// register adds -worker and -lease to fs.
func (f *fleetFlags) register(fs interface {
	StringVar(*string, string, string, string)
	DurationVar(*time.Duration, string, time.Duration, string)
}) {
	fs.StringVar(&f.worker, "worker", "", "with a postgres:// journal: this worker's name in the entries it leases (default host:pid)")
	fs.DurationVar(&f.lease, "lease", postgres.DefaultLease, "with a postgres:// journal: how long an entry this worker sends stays leased to it; a worker that\ndies holds its entries this long before another resends them. Set it above the longest call, retries included")
}

// check validates the flags; they only apply to a shared journal.
func (f *fleetFlags) check(journal string, set map[string]bool) error {
	if !isPostgresURL(journal) {
		for _, name := range []string{"worker", "lease"} {
			if set[name] {
				return fail(exitUsage, "-%s applies only to a postgres:// journal", name)
			}
		}
		return nil
	}
	if f.lease <= 0 {
		return fail(exitUsage, "-lease must be positive")
	}
	return nil
}

// fleetJournal is contrib/postgres's Journal on its pool: what the batch
// and resume commands need of a journal.
type fleetJournal struct {
	*postgres.Journal
	pool *pgxpool.Pool
}

// Sync returns nil: every write of the journal is committed before it
// returns, so nothing is buffered.
func (f *fleetJournal) Sync(context.Context) error { return nil }

// Close closes the pool.
func (f *fleetJournal) Close() error {
	f.pool.Close()
	return nil
}

// openFleetJournal connects to the database at dsn, creates the journal's
// table if it is missing (Migrate, in the first schema of the
// search_path, which the URL may set: ?search_path=batch_7), and returns
// the journal. Messages never show the URL's password.
func openFleetJournal(ctx context.Context, dsn string, f fleetFlags) (*fleetJournal, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's own message quotes the URL; say only that it is wrong.
		return nil, fail(exitUsage, "-journal %s: not a PostgreSQL URL pgx can use (postgres://user@host:port/db?sslmode=...)", redactDSN(dsn))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fail(exitJournal, "journal %s: %v", redactDSN(dsn), err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fail(exitJournal, "journal %s: cannot reach the database: %v", redactDSN(dsn), err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fail(exitJournal, "journal %s: create the journal's table: %v", redactDSN(dsn), err)
	}
	return &fleetJournal{Journal: postgres.NewJournal(pool, &postgres.JournalOptions{Worker: f.worker, Lease: f.lease}), pool: pool}, nil
}

// leaseLost reports whether a journal error says only that this worker's
// lease on an entry ended and another worker holds it now: the other
// worker records the outcome, and the run goes on.
func leaseLost(err error) bool {
	return errors.Is(err, postgres.ErrLeaseLost) || errors.Is(err, idemhttp.ErrFenced)
}

// runFleetBatch is batch on a shared journal: load the input's operations
// as pending entries, then claim and send them until none of them is
// pending in the journal, whoever sent them.
func runFleetBatch(ctx context.Context, o *batchOptions, e env, ops []operation, inputErrs int) (err error) {
	if o.keySecret == nil && !o.keys.random {
		return fail(exitUsage, "with a postgres:// journal, keys are derived from the secret in %s (the same on every machine of the fleet) or in an explicit -key-file; or -random-keys has the first worker to load an operation mint its key", o.keys.secretEnv)
	}
	fj, err := openFleetJournal(ctx, o.journal, o.fleet)
	if err != nil {
		return err
	}
	defer fj.Close()
	name := redactDSN(o.journal)
	// Each operation's fingerprint, computed once: the wait in claimAll
	// compares every pending entry with its operation every poll. (Ids are
	// unique: loadInput rejects a second line with the same id.)
	byID := make(map[string]operation, len(ops))
	fps := make(map[string]string, len(ops))
	for _, op := range ops {
		byID[op.ID] = op
		fps[op.ID] = fingerprint(op)
	}

	r := newRunner(runnerConfig{
		name: "batch", path: name, fj: fj, concurrency: o.concurrency, timeout: o.timeout,
		attempts: o.attempts, creds: &o.creds, progress: o.progress, total: len(ops), env: e,
		contentType: o.spec.contentType(), rate: o.rate, retention: o.retention, maxRetryAfter: o.maxRetryAfter, benign: leaseLost,
	})
	defer r.close()
	for _, op := range ops {
		r.lines[op.ID] = op.Line
	}
	opCtx, stop := r.watch(ctx, o.grace)
	defer stop()

	// Load: each operation's entry, unless the journal has it already
	// (another worker loaded it, or an earlier run did).
	for _, op := range ops {
		if ctx.Err() != nil {
			break
		}
		en, err := fj.Enqueue(context.WithoutCancel(ctx), o.fleetEntry(op, fps[op.ID]))
		if err != nil {
			return describeJournalErr(name, err)
		}
		if en == nil || en.State == idemhttp.StatePending {
			continue
		}
		// Done (or abandoned) before this worker started: as on a file.
		if o.checkDone && en.Fingerprint != fps[op.ID] {
			inputErrs++
			r.prog.printf("idemctl batch: %s:%d: operation %q differs from the request journaled under key %s; the journaled one stands\n", o.in, op.Line, op.ID, en.Key)
		}
		r.report(skippedResult(op, en))
	}
	r.claimAll(ctx, opCtx, fj, func(en *idemhttp.Entry) (operation, bool) {
		op, ok := byID[en.Operation]
		if !ok || en.Fingerprint != fps[op.ID] {
			return op, false
		}
		op.key, op.resume = en.Key, en.Attempts > 0
		return op, true
	})
	stop()
	return r.fleetSummary(ctx, fj, ops, inputErrs)
}

// fleetEntry is the pending entry of op, whose fingerprint is fp, that
// Enqueue loads: complete, so that any worker can send it.
func (o *batchOptions) fleetEntry(op operation, fp string) *idemhttp.Entry {
	key := idemhttp.NewKey()
	if o.keySecret != nil {
		if k, err := idemhttp.DeriveKey(o.keySecret, op.ID); err == nil { // validated already
			key = k
		}
	}
	h := http.Header{"User-Agent": {"idemctl"}}
	if op.Body != nil {
		h.Set("Content-Type", o.spec.contentType())
	}
	return &idemhttp.Entry{
		Operation: op.ID, Key: key, Method: op.Method, URL: op.URL, Header: h, Body: op.Body,
		Fingerprint: fp, State: idemhttp.StatePending,
	}
}

// claimAll claims pending entries, r.concurrency at a time, and sends
// those accept takes (as the operation to send), until none is left
// pending: entries other workers hold are waited for, since a worker that
// died leaves them to this one when their leases end. An entry accept
// refuses (another input's, or one whose line changed) is handed back at
// once, unsent and unchanged (Release: no lease kept, its last status
// left as it was), so that its own batch's workers can claim it at once;
// it is reported, and not claimed again by this worker.
func (r *runner) claimAll(ctx, opCtx context.Context, fj *fleetJournal, accept func(*idemhttp.Entry) (operation, bool)) {
	poll := time.NewTicker(250 * time.Millisecond)
	defer poll.Stop()
	var refused []string // keys handed back, in the order met
	for ctx.Err() == nil && !r.stopping.Load() {
		claimed, err := fj.ClaimPendingExcept(context.WithoutCancel(ctx), r.concurrency, refused)
		if err != nil {
			r.failed(err)
			return
		}
		var wg sync.WaitGroup
		for _, en := range claimed {
			op, ok := accept(en)
			if !ok {
				refused = append(refused, en.Key)
				r.prog.printf("idemctl %s: journal entry %s (operation %q, %s %s) is not this input's, or its line changed: left pending for its own batch\n",
					r.name, en.Key, en.Operation, en.Method, en.URL)
				if err := fj.Release(context.WithoutCancel(ctx), en.Key); err != nil && !errors.Is(err, idemhttp.ErrNotFound) {
					r.failed(err)
				}
				continue
			}
			wg.Go(func() { r.do(opCtx, op, nil) })
		}
		wg.Wait()
		if len(claimed) > 0 {
			continue
		}
		left, err := fj.Pending(context.WithoutCancel(ctx))
		if err != nil {
			r.failed(err)
			return
		}
		mine := 0
		for _, en := range left {
			if _, ok := accept(en); ok {
				mine++
			}
		}
		if mine == 0 {
			return // every operation of the input is done, by some worker
		}
		select { // held by other workers, alive or not: wait for them
		case <-poll.C:
		case <-ctx.Done():
		}
	}
}

// runFleetResume is resume on a shared journal: claim and resend every
// pending entry, with its stored request, until none is left. Unlike
// Client.Resume it leaves the entries other workers hold to them.
func runFleetResume(ctx context.Context, e env, cfg runnerConfig, f fleetFlags, dsn string, grace time.Duration) error {
	fj, err := openFleetJournal(ctx, dsn, f)
	if err != nil {
		return err
	}
	defer fj.Close()
	pending, err := fj.Pending(ctx)
	if err != nil {
		return describeJournalErr(cfg.path, err)
	}
	cfg.fj, cfg.total, cfg.benign = fj, len(pending), leaseLost
	r := newRunner(cfg)
	defer r.close()
	opCtx, stop := r.watch(ctx, grace)
	defer stop()
	r.claimAll(ctx, opCtx, fj, func(en *idemhttp.Entry) (operation, bool) {
		// idemctl names every operation; an entry without an id is
		// another program's, and left to it.
		return operation{ID: en.Operation, Method: en.Method, URL: en.URL, Body: en.Body, header: en.Header, key: en.Key, resume: true}, en.Operation != ""
	})
	stop()
	if err := r.summary(ctx, len(pending), 0); err != nil {
		return err
	}
	left, err := fj.Pending(context.WithoutCancel(ctx))
	if err != nil {
		return describeJournalErr(cfg.path, err)
	}
	if len(left) > 0 {
		return fail(exitFailed, "%d entries of the journal are still pending (listed above): not idemctl's to resend", len(left))
	}
	return nil
}

// fleetSummary prints what the journal says of the input's operations,
// whichever worker sent them, besides what this worker did, and returns
// the exit code as summary does: the journal failing, an interruption
// that left work, a server never reached, rejected input, then failed or
// pending operations.
func (r *runner) fleetSummary(ctx context.Context, fj *fleetJournal, ops []operation, inputErrs int) error {
	t := r.prog.finish()
	var done, failed, pending int
	for _, op := range ops {
		en, err := fj.Lookup(context.WithoutCancel(ctx), op.ID)
		switch {
		case errors.Is(err, idemhttp.ErrNotFound):
			pending++ // not loaded: a signal came first
		case err != nil:
			return describeJournalErr(r.path, err)
		case en.State == idemhttp.StatePending:
			pending++
		case en.State == idemhttp.StateDone && en.LastStatus >= 200 && en.LastStatus < 300:
			done++
		default:
			failed++
		}
	}
	fmt.Fprintf(r.stderr, "idemctl %s: this worker: %d operations in %s: %d ok, %d failed, %d pending; %d done before it started (not sent), %d replayed by the server; %d attempts\n",
		r.name, t.done(), time.Since(r.start).Round(time.Millisecond), t.ok, t.failed, t.pending, t.skipped, t.replayed, r.counter.attempts.Load())
	fmt.Fprintf(r.stderr, "idemctl %s: the journal, all workers: %d operations of the input: %d ok, %d failed, %d pending\n", r.name, len(ops), done, failed, pending)
	if inputErrs > 0 {
		fmt.Fprintf(r.stderr, "idemctl %s: %d input lines rejected (listed above)\n", r.name, inputErrs)
	}
	if pending > 0 {
		fmt.Fprintf(r.stderr, "idemctl %s: rerun the same command (on any machine) to send the %d pending operations with their keys\n", r.name, pending)
	}
	r.mu.Lock()
	noConnect, firstNoConnect := r.neverConnected, r.firstNoConnect
	r.mu.Unlock()
	switch {
	case r.journalErr() != nil:
		return describeJournalErr(r.path, r.journalErr())
	case ctx.Err() != nil && pending > 0:
		return &exitError{code: exitInterrupted}
	case noConnect > 0 && r.counter.responses.Load() == 0:
		return fail(exitUnreachable, "the server was never reached: %v", firstNoConnect)
	case inputErrs > 0:
		return &exitError{code: exitInput}
	case failed+pending > 0:
		return &exitError{code: exitFailed}
	}
	return nil
}
