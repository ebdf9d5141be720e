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
)

// errStopping is what gatedJournal.Begin returns once the run is
// stopping: Do fails before sending anything, so the operation simply has
// not started.
var errStopping = errors.New("stopping: operation not started")

// gatedJournal is the journal as the batch and resume commands see it. It
// refuses to begin operations once a signal has arrived, which stops both
// the input loop and Client.Resume from starting new ones while those in
// flight finish; it remembers the key of each operation, which Do does not
// return on failure; and it notices the journal failing underneath.
type gatedJournal struct {
	idemhttp.Journal
	stopping atomic.Bool

	// hide, when set, keeps entries out of Pending, and so out of
	// Client.Resume: the batch resends them itself. Set before use.
	hide func(*idemhttp.Entry) bool

	mu   sync.Mutex
	keys map[string]string // operation id -> key
	err  error             // the first failed journal write
}

func newGatedJournal(j idemhttp.Journal) *gatedJournal {
	return &gatedJournal{Journal: j, keys: make(map[string]string)}
}

// Begin refuses new operations once the run is stopping, and records the
// key of each operation it begins or finds.
func (g *gatedJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	if g.stopping.Load() {
		return nil, errStopping
	}
	existing, err := g.Journal.Begin(ctx, e)
	if err != nil {
		// A Begin cancelled while it queued (the grace period ended) or
		// refusing a bad entry wrote nothing, and says nothing about
		// the file.
		if ctx.Err() == nil && !errors.Is(err, idemhttp.ErrInvalidKey) && !errors.Is(err, idemhttp.ErrInvalidRequest) {
			g.failed(err)
		}
		return nil, err
	}
	if e.Operation != "" {
		key := e.Key
		if existing != nil {
			key = existing.Key
		}
		g.mu.Lock()
		g.keys[e.Operation] = key
		g.mu.Unlock()
	}
	return existing, nil
}

// Finish records an outcome; a failure stops the run.
func (g *gatedJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	err := g.Journal.Finish(ctx, key, o)
	if err != nil {
		g.failed(err)
	}
	return err
}

// Pending returns the pending entries that are not hidden.
func (g *gatedJournal) Pending(ctx context.Context) ([]*idemhttp.Entry, error) {
	es, err := g.Journal.Pending(ctx)
	if err != nil || g.hide == nil {
		return es, err
	}
	return slices.DeleteFunc(es, g.hide), nil
}

// failed records a journal write failure and stops the run: with a
// journal that cannot write (disk full, file damaged), every further
// operation would be sent without a durable key.
func (g *gatedJournal) failed(err error) {
	g.stopping.Store(true)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err == nil {
		g.err = err
	}
}

// key returns the key journaled for operation, "" if none was.
func (g *gatedJournal) key(operation string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.keys[operation]
}

// journalErr returns the first journal write failure.
func (g *gatedJournal) journalErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// runner is what the batch and resume commands share: the client over a
// gated journal, the result stream, progress, and the signal handling.
type runner struct {
	name    string // command name, for messages
	path    string // journal file
	fj      *idemhttp.FileJournal
	gate    *gatedJournal
	counter *counter
	tr      *http.Transport
	client  *idemhttp.Client
	out     *resultWriter
	prog    *progress
	stderr  io.Writer
	start   time.Time

	contentType string // of input operations' bodies

	// lines maps input operation ids to their line numbers.
	lines map[string]int

	mu             sync.Mutex
	neverConnected int   // failures where no request reached a server
	firstNoConnect error // the first of them, for the message
}

// runnerConfig configures newRunner.
type runnerConfig struct {
	name        string
	path        string
	fj          *idemhttp.FileJournal
	concurrency int
	timeout     time.Duration
	attempts    int
	creds       *credentialFlags
	progress    string
	total       int
	env         env
	contentType string  // of input bodies; "" means application/json
	rate        float64 // attempts per second at most; 0: no limit
}

func newRunner(cfg runnerConfig) *runner {
	r := &runner{
		name:   cfg.name,
		path:   cfg.path,
		fj:     cfg.fj,
		gate:   newGatedJournal(cfg.fj),
		tr:     newTransport(cfg.concurrency),
		out:    newResultWriter(cfg.env.stdout),
		prog:   newProgress(cfg.env.stderr, cfg.progress, cfg.total, cfg.env.isTerminal != nil && cfg.env.isTerminal(cfg.env.stderr)),
		stderr: cfg.env.stderr,
		start:  time.Now(),
		lines:  map[string]int{},

		contentType: cmp.Or(cfg.contentType, "application/json"),
	}
	r.counter = &counter{rt: r.tr, limiter: newLimiter(cfg.rate)}
	r.client = newClient(clientConfig{journal: r.gate, rt: r.counter, timeout: cfg.timeout, attempts: cfg.attempts, creds: cfg.creds})
	return r
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
		r.gate.stopping.Store(true)
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

// resume resends the journal's pending entries (those the gate does not
// hide) with Client.Resume and reports each. It returns the operation ids
// it reported; its error, with exit code 3, says the journal failed.
func (r *runner) resume(ctx context.Context) (map[string]bool, error) {
	done := map[string]bool{}
	rrs, err := r.client.Resume(ctx)
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
// the key from the operation id.
func (r *runner) do(ctx context.Context, op operation, secret []byte) {
	rctx := idemhttp.WithOperation(ctx, op.ID)
	res := &result{ID: op.ID, Line: op.Line, Source: sourceRun}
	if op.resume {
		res.Source = sourceResume
	}
	if secret != nil {
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
	if op.Body != nil {
		req.Header.Set("Content-Type", r.contentType)
	}
	req.Header.Set("User-Agent", "idemctl")
	resp, err := r.client.Do(req)
	if errors.Is(err, errStopping) {
		return // not started
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
	if k := r.gate.key(op.ID); k != "" {
		res.Key = k
	}
	r.finish(res)
}

// setErr records a call's error in res, with the status it carries.
func (r *runner) setErr(res *result, err error) {
	if err == nil {
		return
	}
	res.Error = err.Error()
	var gu *idemhttp.GiveUpError
	var km *idemhttp.KeyMismatchError
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
		// must still happen.
		if e, err := r.fj.Get(context.Background(), res.Key); err == nil {
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
	if r.out.err != nil {
		fmt.Fprintf(r.stderr, "idemctl %s: writing results: %v (the journal has every outcome: idemctl pending, idemctl inspect)\n", r.name, r.out.err)
	}
	r.mu.Lock()
	noConnect, firstNoConnect := r.neverConnected, r.firstNoConnect
	r.mu.Unlock()
	switch {
	case r.gate.journalErr() != nil:
		return describeJournalErr(r.path, r.gate.journalErr())
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
