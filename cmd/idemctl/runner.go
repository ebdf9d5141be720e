package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtrace"
)

// errStopping is what the client's PrepareRequest returns once the run is
// stopping: Do (and Resume, which sends through Do) fails before sending
// anything, so the operation simply has not started. PrepareRequest runs
// once per call, after the journal entry is written and before the first
// attempt; an entry the call created is withdrawn, one it found stays
// pending, as it was.
var errStopping = errors.New("stopping: operation not started")

// batchJournal is what the batch and resume commands need of the journal:
// a *filejournal.Journal, or in tests a wrapper that counts its reads.
type batchJournal interface {
	idemhttp.Journal
	// Sync returns the error of any earlier failed write.
	Sync(ctx context.Context) error
}

// notJournalFailure lists the errors a Begin reports that say nothing
// about the file: the call's own request or key was refused, or the
// operation's entry decided the call (done, changed, expired). Any other
// error of a journal operation is taken as the journal failing.
var notJournalFailure = []error{
	idemhttp.ErrInvalidKey, idemhttp.ErrInvalidRequest, idemhttp.ErrKeyConflict, idemhttp.ErrKeyMismatch,
	idemhttp.ErrAlreadyDone, idemhttp.ErrKeyExpired, idemhttp.ErrClockJump,
	context.Canceled, context.DeadlineExceeded,
}

// runner is what the batch and resume commands share: the client, the
// result stream, progress, and the signal handling.
//
// It has no journal wrapper of its own (issue 15): the stop gate is the
// client's PrepareRequest, keys come from the journal's Lookup, DeriveKey
// or the errors and ResponseInfo of Do, journal failures from
// Hooks.OnJournal (Do only logs a failed Finish) and a final Sync, and
// entries the batch sends itself are kept from Resume by its Filter.
type runner struct {
	name     string // command name, for messages
	path     string // journal file
	fj       batchJournal
	stopping atomic.Bool // set by a signal or a journal failure: start nothing new
	counter  *counter
	tr       *http.Transport
	client   *idemhttp.Client
	out      *resultWriter
	prog     *progress
	stderr   io.Writer
	start    time.Time

	contentType string // of input operations' bodies
	concurrency int    // operations (and resends) in flight at once

	// lines maps input operation ids to their line numbers.
	lines map[string]int

	// hide, when set, keeps pending entries out of Resume: the batch
	// resends them itself. Set before resume.
	hide func(*idemhttp.Entry) bool

	// benign, when set, tells a journal error that does not stop the run.
	benign func(error) bool

	mu             sync.Mutex
	neverConnected int       // failures where no request reached a server
	firstNoConnect error     // the first of them, for the message
	jerr           error     // the first journal write failure
	parked         int       // pending operations parked by the server's Retry-After
	parkedUntil    time.Time // the latest of their times
}

// runnerConfig configures newRunner.
type runnerConfig struct {
	name        string
	path        string
	fj          batchJournal
	concurrency int
	timeout     time.Duration
	attempts    int
	creds       *credentialFlags
	progress    string
	total       int
	env         env
	contentType string        // of input bodies; "" means application/json
	rate        float64       // attempts per second at most; 0: no limit
	retention   time.Duration // the server's key retention: Policy.Retention
	// maxRetryAfter is Policy.MaxRetryAfter (-max-retry-after).
	maxRetryAfter time.Duration
	// benign, when set, tells a journal error that does not stop the run
	// (a shared journal's lease that another worker took over).
	benign func(error) bool
}

func newRunner(cfg runnerConfig) *runner {
	r := &runner{
		name:        cfg.name,
		path:        cfg.path,
		fj:          cfg.fj,
		concurrency: cfg.concurrency,
		tr:          newTransport(cfg.concurrency),
		out:         newResultWriter(cfg.env.stdout),
		prog:        newProgress(cfg.env.stderr, cfg.progress, cfg.total, cfg.env.isTerminal != nil && cfg.env.isTerminal(cfg.env.stderr)),
		stderr:      cfg.env.stderr,
		start:       time.Now(),
		lines:       map[string]int{},
		benign:      cfg.benign,

		contentType: cmp.Or(cfg.contentType, "application/json"),
	}
	r.counter = &counter{rt: r.tr, limiter: newLimiter(cfg.rate)}
	r.client = newClient(clientConfig{
		journal: cfg.fj, rt: r.counter, timeout: cfg.timeout, attempts: cfg.attempts, creds: cfg.creds, retention: cfg.retention,
		maxRetryAfter: cfg.maxRetryAfter, stopping: &r.stopping, onJournal: r.onJournal,
	})
	return r
}

// onJournal notices the journal failing underneath a call (Hooks.OnJournal)
// and stops the run: with a journal that cannot write (disk full, file
// damaged), every further operation would be sent without a durable key.
// Do returns a failed Begin as an error, but only logs a failed Finish.
func (r *runner) onJournal(ctx context.Context, ev idemtrace.JournalEvent) {
	if ev.Err == nil || (r.benign != nil && r.benign(ev.Err)) {
		return
	}
	if ev.Op == idemtrace.JournalBegin {
		// A Begin cancelled while it queued (the grace period ended), or
		// refusing the call, wrote nothing and says nothing about the file.
		if ctx.Err() != nil {
			return
		}
		for _, s := range notJournalFailure {
			if errors.Is(ev.Err, s) {
				return
			}
		}
	}
	r.failed(ev.Err)
}

// failed records a journal write failure and stops the run.
func (r *runner) failed(err error) {
	r.stopping.Store(true)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.jerr == nil {
		r.jerr = err
	}
}

// journalErr returns the first journal write failure; it asks the journal
// too, for a write no hook saw (Resume abandoning an expired entry).
func (r *runner) journalErr() error {
	r.mu.Lock()
	err := r.jerr
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return r.fj.Sync(context.Background())
}

// watch returns the context for requests, and a function to call when
// the run is over. A signal (ctx done) does not cancel the requests'
// context: an attempt already on the wire finishes and its outcome reaches
// the journal. It stops new operations at once and, after grace, cancels
// the requests still running; their entries stay pending, for the next
// run. The function may be called more than once.
func (r *runner) watch(ctx context.Context, grace time.Duration) (context.Context, func()) {
	opCtx, cancelOps := context.WithCancel(context.WithoutCancel(ctx))
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-finished:
			return
		case <-ctx.Done():
		}
		r.stopping.Store(true)
		r.prog.printf("idemctl %s: %v: starting no new operations; waiting up to %s for those in flight (Ctrl-C again quits at once: the journal keeps their keys)\n",
			r.name, context.Cause(ctx), grace)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-finished:
		case <-t.C:
			r.prog.printf("idemctl %s: grace period over: cancelling the operations still in flight; they stay pending\n", r.name)
			cancelOps()
		}
	})
	var once sync.Once
	return opCtx, func() {
		once.Do(func() {
			close(finished)
			wg.Wait()
			cancelOps()
		})
	}
}

// close releases the connections. The journal belongs to the caller.
func (r *runner) close() {
	r.tr.CloseIdleConnections()
}

// resume resends the journal's pending entries (those r.hide does not
// hide) with Client.Resume and reports each. It returns the operation ids
// it reported; its error, with exit code 3, says the journal failed.
//
// It hands Resume the pending entries (ResumeOptions.Entries) instead of
// letting it read them, because Resume would first prune the done
// entries older than the retention, and nothing would record them: a
// later batch naming one would send it again, to a server that has
// forgotten its key (the duplicates of issue 15). Only idemctl prune
// deletes entries, recording them first; openJournal turns the journal's
// own pruning off for the same reason.
func (r *runner) resume(ctx context.Context) (map[string]bool, error) {
	done := map[string]bool{}
	pending, err := r.fj.Pending(ctx)
	if err != nil {
		return done, describeJournalErr(r.path, err)
	}
	if len(pending) == 0 {
		return done, nil // and a nil Entries would mean "the journal's, pruned first"
	}
	opts := idemhttp.ResumeOptions{Concurrency: r.concurrency, Entries: pending}
	if r.hide != nil {
		opts.Filter = func(e *idemhttp.Entry) bool { return !r.hide(e) }
	}
	rrs, err := r.client.Resume(ctx, &opts)
	for _, rr := range rrs {
		if errors.Is(rr.Err, errStopping) {
			continue // not started: stays pending for the next run
		}
		res := &result{
			ID:       rr.Entry.Operation,
			Line:     r.lines[rr.Entry.Operation],
			Key:      rr.Entry.Key,
			Source:   sourceResume,
			Status:   rr.StatusCode,
			Replayed: rr.Replayed,
		}
		res.setResponse(rr.Body)
		r.setErr(res, rr.Err)
		r.finish(res)
		if rr.Entry.Operation != "" {
			done[rr.Entry.Operation] = true
		}
	}
	if err != nil && ctx.Err() == nil {
		return done, describeJournalErr(r.path, err)
	}
	return done, nil
}

// do sends one input operation and reports it. secret, when set, derives
// the key from the operation id; op.key, when set, is the key the journal
// holds for it, which Do uses (the operation's journaled key wins).
func (r *runner) do(ctx context.Context, op operation, secret []byte) {
	rctx := idemhttp.WithOperation(ctx, op.ID)
	res := &result{ID: op.ID, Line: op.Line, Source: sourceRun}
	if op.resume {
		res.Source = sourceResume
	}
	switch {
	case op.key != "":
		// The journal's entry, found by Lookup: Do resends it with its
		// key; a derived key that differs would be a conflict.
		res.Key = op.key
	case secret != nil:
		key, err := idemhttp.DeriveKey(secret, op.ID)
		if err != nil { // unreachable: the secret and the id were validated
			res.Error = err.Error()
			r.finish(res)
			return
		}
		rctx = idemhttp.WithKey(rctx, key)
		res.Key = key
	}
	var body io.Reader
	if op.Body != nil {
		body = bytes.NewReader(op.Body)
	}
	req, err := http.NewRequestWithContext(rctx, op.Method, op.URL, body)
	if err != nil {
		res.Error = err.Error()
		r.finish(res)
		return
	}
	switch {
	case op.header != nil:
		for k, vv := range op.header {
			req.Header[k] = slices.Clone(vv)
		}
	case op.Body != nil:
		req.Header.Set("Content-Type", r.contentType)
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "idemctl")
	}
	if r.stopping.Load() {
		return // not started
	}
	resp, err := r.client.Do(req)
	if errors.Is(err, errStopping) {
		return // not started
	}
	if k := sentKey(resp, err); k != "" {
		res.Key = k
	}
	var de *idemhttp.DoneError
	if errors.As(err, &de) {
		// Done by the time Do looked (the same id twice in the input):
		// nothing was sent.
		r.report(skippedResult(op, &idemhttp.Entry{Key: de.Key, LastStatus: de.Status, Attempts: de.Attempts, State: idemhttp.StateDone}))
		return
	}
	if err == nil {
		res.Status, res.Replayed = resp.StatusCode, idemhttp.Replayed(resp)
		b, rerr := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
		resp.Body.Close()
		res.setResponse(b)
		if rerr != nil {
			// The outcome is known (the status arrived and is journaled);
			// only the copy of the body is incomplete.
			res.Error = "reading the response body: " + rerr.Error()
		}
	}
	r.setErr(res, err)
	r.finish(res)
}

// sentKey returns the key a call used, from its response or its error, ""
// when neither says (a call refused before its key was chosen).
func sentKey(resp *http.Response, err error) string {
	if resp != nil {
		if info, ok := idemhttp.ResponseInfo(resp); ok {
			return info.Key
		}
	}
	var gu *idemhttp.GiveUpError
	var km *idemhttp.KeyMismatchError
	var de *idemhttp.DoneError
	var pe *idemhttp.ParkedError
	switch {
	case errors.As(err, &pe):
		return pe.Key
	case errors.As(err, &gu):
		return gu.Key
	case errors.As(err, &km):
		return km.Key
	case errors.As(err, &de):
		return de.Key
	}
	return ""
}

// setErr records a call's error in res, with the status it carries.
func (r *runner) setErr(res *result, err error) {
	if err == nil {
		return
	}
	res.Error = err.Error()
	var gu *idemhttp.GiveUpError
	var km *idemhttp.KeyMismatchError
	if pe := (*idemhttp.ParkedError)(nil); errors.As(err, &pe) {
		res.NotBefore = &pe.NotBefore
	}
	switch {
	case errors.As(err, &gu) && res.Status == 0:
		res.Status = gu.LastStatus
	case errors.As(err, &km) && res.Status == 0:
		res.Status = km.StatusCode
	}
	if neverConnected(err) {
		r.mu.Lock()
		r.neverConnected++
		if r.firstNoConnect == nil {
			r.firstNoConnect = err
		}
		r.mu.Unlock()
	}
}

// finish completes res from the journal (state, attempts over all runs),
// classifies and reports it.
func (r *runner) finish(res *result) {
	if res.Key != "" {
		// The requests' context may be cancelled by now; this local read
		// must still happen. Lookup answers from the index, without
		// reading the request back; Get for an entry without an id.
		var e *idemhttp.Entry
		var err error
		if res.ID != "" {
			e, err = r.fj.Lookup(context.Background(), res.ID)
		} else {
			e, err = r.fj.Get(context.Background(), res.Key)
		}
		if err == nil && e.Key == res.Key {
			res.State, res.Attempts = e.State, e.Attempts
			if res.Status == 0 {
				res.Status = e.LastStatus
			}
		}
	}
	res.classify()
	r.report(res)
}

// report writes res to stdout and counts it.
func (r *runner) report(res *result) {
	r.out.write(res)
	r.prog.add(res)
	if res.NotBefore != nil && res.Result == resultPending {
		r.mu.Lock()
		r.parked++
		if res.NotBefore.After(r.parkedUntil) {
			r.parkedUntil = *res.NotBefore
		}
		r.mu.Unlock()
	}
}

// summary prints the run's totals on stderr and returns the exit code:
// a journal failure first, then an interruption that left work undone,
// an unreachable server, rejected input, failed or pending operations.
func (r *runner) summary(ctx context.Context, total, inputErrs int) error {
	t := r.prog.finish()
	notStarted := max(total-t.done(), 0)
	fmt.Fprintf(r.stderr, "idemctl %s: %d operations in %s: %d ok, %d failed, %d pending, %d not started; %d done in an earlier run (not sent), %d replayed by the server; %d attempts\n",
		r.name, total, time.Since(r.start).Round(time.Millisecond), t.ok, t.failed, t.pending, notStarted, t.skipped, t.replayed, r.counter.attempts.Load())
	if inputErrs > 0 {
		fmt.Fprintf(r.stderr, "idemctl %s: %d input lines rejected (listed above)\n", r.name, inputErrs)
	}
	switch {
	case t.pending > 0 && notStarted > 0:
		fmt.Fprintf(r.stderr, "idemctl %s: rerun the same command to resend the %d pending operations with their keys and start the %d not started\n",
			r.name, t.pending, notStarted)
	case t.pending > 0:
		fmt.Fprintf(r.stderr, "idemctl %s: rerun the same command to resend the %d pending operations with their keys\n", r.name, t.pending)
	case notStarted > 0:
		fmt.Fprintf(r.stderr, "idemctl %s: rerun the same command to start the %d operations not started\n", r.name, notStarted)
	}
	r.mu.Lock()
	parked, until := r.parked, r.parkedUntil
	r.mu.Unlock()
	if parked > 0 {
		fmt.Fprintf(r.stderr, "idemctl %s: %d of them parked: the server asked to come back later (Retry-After); nothing sends them before their time, the latest %s (idemctl pending shows each)\n",
			r.name, parked, until.UTC().Format(time.RFC3339))
	}
	if r.out.err != nil {
		fmt.Fprintf(r.stderr, "idemctl %s: writing results: %v (the journal has every outcome: idemctl pending, idemctl inspect)\n", r.name, r.out.err)
	}
	r.mu.Lock()
	noConnect, firstNoConnect := r.neverConnected, r.firstNoConnect
	r.mu.Unlock()
	switch {
	case r.journalErr() != nil:
		return describeJournalErr(r.path, r.journalErr())
	case ctx.Err() != nil && t.pending+notStarted > 0:
		return &exitError{code: exitInterrupted}
	case noConnect > 0 && r.counter.responses.Load() == 0:
		return fail(exitUnreachable, "the server was never reached: %v", firstNoConnect)
	case inputErrs > 0:
		return &exitError{code: exitInput}
	case t.failed+t.pending > 0:
		return &exitError{code: exitFailed}
	}
	return nil
}
