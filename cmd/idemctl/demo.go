package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/idemtrace"
)

const demoSynopsis = `Usage: idemctl demo [flags]

Starts a fake payments API (idemtest) on loopback that loses requests, loses
responses after making the charge, replies slowly, and answers 409 and 503
with Retry-After. Sends N charges through idemhttp with a journal file in a
temporary folder, and crashes half way: the run is abandoned as a killed
process would leave it, with the charges in flight unrecorded. A second run
reopens the journal, resumes the pending charges with their keys and sends
the rest. Then the same workload, crash included, goes through plain
net/http, through go-retryablehttp (its defaults, with a short timeout and
tiny waits; no keys, as most of their users send), and through
go-retryablehttp with an Idempotency-Key minted per call (what sending a key
gives without a journal), each against a fresh server with the same seed,
and a table shows what each server executed. Progress goes to stderr: a bar
on a terminal, plain lines otherwise.

Exit code 1 if idemhttp shows a duplicate or lost charge.
`

// demoOptions are the demo's settings.
type demoOptions struct {
	n           int
	concurrency int
	faults      idemtest.Faults
	timeout     time.Duration // per attempt, for every client
	attempts    int           // idemhttp's MaxAttempts
	crashAfter  float64       // fraction of the charges finished before the crash
	progress    string        // auto, bar, lines or none
}

func demoCommand(ctx context.Context, args []string, e env) error {
	o := &demoOptions{}
	fs := newFlagSet("demo", demoSynopsis, e)
	fs.IntVar(&o.n, "n", 500, "charges to send")
	fs.IntVar(&o.concurrency, "concurrency", 16, "charges in flight at once")
	fs.Uint64Var(&o.faults.Seed, "seed", 1, "fault seed; the same seed gives every client the same faults")
	fs.Float64Var(&o.faults.DropRequest, "drop-request", 0.05, "rate of requests lost before the server sees them")
	fs.Float64Var(&o.faults.DropResponse, "drop-response", 0.05, "rate of responses lost after the charge was made")
	fs.Float64Var(&o.faults.Slow, "slow", 0.03, "rate of replies slower than -timeout (the charge is made)")
	fs.Float64Var(&o.faults.Unavailable, "unavailable", 0.05, "rate of 503 with Retry-After")
	fs.Float64Var(&o.faults.Conflict, "conflict", 0.02, "rate of bursts of 409 (in progress) with Retry-After")
	fs.IntVar(&o.faults.MaxPerOperation, "max-faults", 2, "faults injected into one charge at most (0: no cap)")
	fs.DurationVar(&o.faults.RetryAfter, "retry-after", time.Second, "Retry-After sent with 503 and 409, rounded up to seconds")
	fs.DurationVar(&o.timeout, "timeout", 250*time.Millisecond, "timeout of one attempt, for every client")
	fs.IntVar(&o.attempts, "attempts", 6, "idemhttp's attempts per charge")
	fs.Float64Var(&o.crashAfter, "crash-after", 0.5, "crash after this fraction of the charges finished (0: no crash)")
	fs.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (a bar on a terminal, else lines), bar, lines or none")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return fail(exitUsage, "unexpected argument %q", rest[0])
	case o.n < 1:
		return fail(exitUsage, "-n must be at least 1")
	case o.concurrency < 1:
		return fail(exitUsage, "-concurrency must be at least 1")
	case o.timeout <= 0:
		return fail(exitUsage, "-timeout must be positive")
	case o.attempts < 1:
		return fail(exitUsage, "-attempts must be at least 1")
	case o.crashAfter < 0 || o.crashAfter >= 1:
		return fail(exitUsage, "-crash-after must be in [0, 1)")
	case o.progress != "auto" && o.progress != "bar" && o.progress != "lines" && o.progress != "none":
		return fail(exitUsage, "-progress must be auto, bar, lines or none")
	}
	for _, r := range []float64{o.faults.DropRequest, o.faults.DropResponse, o.faults.Slow, o.faults.Unavailable, o.faults.Conflict} {
		if r < 0 || r > 1 {
			return fail(exitUsage, "fault rates must be between 0 and 1")
		}
	}
	// A slow reply must outlast the clients' timeout, or it is merely late.
	o.faults.SlowDelay = 4 * o.timeout
	return runDemo(ctx, o, e)
}

// demoOp is one charge of the workload. The body names the operation, so
// the fake API counts executions per charge whether or not a key is sent.
type demoOp struct {
	id   string
	body []byte
}

func demoOps(n int) []demoOp {
	ops := make([]demoOp, n)
	for i := range ops {
		id := fmt.Sprintf("charge-%04d", i)
		ops[i] = demoOp{id: id, body: fmt.Appendf(nil, `{"amount":%d,"currency":"usd","operation":%q}`, 1000+i, id)}
	}
	return ops
}

// runDemo runs the three columns one after the other (running them at
// once would let them compete for two cores and blur the wall times) and
// prints the table.
func runDemo(ctx context.Context, o *demoOptions, e env) error {
	ops := demoOps(o.n)
	printDemoHeader(e.stdout, o)
	var cols []*demoStats
	for _, col := range []struct {
		name string
		run  func(context.Context, *demoOptions, []demoOp, *idemtest.Server, *demoStats) error
	}{
		{"idemhttp", demoIdemhttp},
		{"net/http", demoPlain},
		{"go-retryablehttp", demoRetryable},
		{"go-retryablehttp + Idempotency-Key", demoRetryableKeyed},
	} {
		fmt.Fprintf(e.stderr, "idemctl demo: running %s...\n", col.name)
		prog := newProgress(e.stderr, o.progress, len(ops), e.isTerminal != nil && e.isTerminal(e.stderr))
		st, err := demoColumn(ctx, o, ops, col.name, prog, col.run)
		if err != nil {
			return err
		}
		cols = append(cols, st)
		if ctx.Err() != nil {
			return &exitError{code: exitInterrupted, err: errors.New("interrupted")}
		}
	}
	printDemoTable(e.stdout, o, cols)
	idem := cols[0]
	if idem.duplicates != 0 || idem.lost != 0 {
		fmt.Fprintf(e.stdout, "\nidemhttp: %d duplicates, %d lost: FAILED, this is a bug; please report it with the flags above\n", idem.duplicates, idem.lost)
		return &exitError{code: exitFailed}
	}
	fmt.Fprintf(e.stdout, "\nidemhttp: 0 duplicates, 0 lost: every charge executed exactly once, through faults and a crash.\n")
	return nil
}

// demoColumn runs one client against a fresh server and counts what the
// server executed.
func demoColumn(ctx context.Context, o *demoOptions, ops []demoOp, name string, prog *progress,
	run func(context.Context, *demoOptions, []demoOp, *idemtest.Server, *demoStats) error) (*demoStats, error) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: o.faults})
	defer srv.Close()
	st := &demoStats{name: name, ops: len(ops), retries: map[idemtrace.RetryReason]int{}, prog: prog}
	start := time.Now()
	err := run(ctx, o, ops, srv, st)
	prog.finish()
	if err != nil {
		return nil, err
	}
	st.wall = time.Since(start)
	st.server = srv.Stats()
	snap := srv.Snapshot()
	for _, op := range ops {
		switch n := snap[op.id]; {
		case n == 0:
			st.lost++
		default:
			st.executed += n
			st.duplicates += n - 1
		}
	}
	return st, nil
}

// demoStats is one column of the table.
type demoStats struct {
	name     string
	ops      int
	attempts int64 // attempts the client made
	failed   int   // charges whose last call did not end in a 2xx

	mu      sync.Mutex
	retries map[idemtrace.RetryReason]int

	// prog shows the charges the client has seen succeed, the same bar
	// (or lines) as batch. A charge failed in the first run and retried
	// in the second counts once, when it succeeds.
	prog *progress
	seen map[string]bool // charges already shown as succeeded; under mu

	server     idemtest.Stats
	executed   int // executions of the workload's charges
	duplicates int // executions beyond the first of a charge
	lost       int // charges never executed
	wall       time.Duration

	// idemhttp only: what the crash left and the second run did.
	pendingAtCrash int
	resumed        int
	rerun          int
}

// track wraps send to report each charge the client saw succeed.
func (s *demoStats) track(send func(context.Context, demoOp) bool) func(context.Context, demoOp) bool {
	return func(ctx context.Context, op demoOp) bool {
		ok := send(ctx, op)
		if ok {
			s.succeeded(op.id)
		}
		return ok
	}
}

// succeeded shows the charge op as succeeded, once: a charge the crashed
// run saw succeed may be resumed and succeed again.
func (s *demoStats) succeeded(op string) {
	s.mu.Lock()
	first := !s.seen[op]
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	s.seen[op] = true
	s.mu.Unlock()
	if first && s.prog != nil {
		s.prog.add(&result{Result: resultOK})
	}
}

// retry counts a retry by reason. Safe for concurrent use.
func (s *demoStats) retry(r idemtrace.RetryReason) {
	s.mu.Lock()
	s.retries[r]++
	s.mu.Unlock()
}

// pool sends ops with workers; send reports whether the client saw the
// charge succeed. With crashAfter > 0, once that many charges have
// finished, crash runs and the run is abandoned: the context of every
// call in flight is cancelled and no charge starts. It returns which
// charges succeeded, in the order of ops.
func pool(ctx context.Context, ops []demoOp, workers, crashAfter int, crash func(), send func(context.Context, demoOp) bool) []bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ok := make([]bool, len(ops))
	var next, finished atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	for range min(workers, len(ops)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(ops) {
					return
				}
				ok[i] = send(ctx, ops[i])
				if n := finished.Add(1); crashAfter > 0 && n >= int64(crashAfter) {
					once.Do(func() {
						crash()
						cancel()
					})
				}
			}
		})
	}
	wg.Wait()
	return ok
}

// crashAt is how many charges finish before the crash, 0 for none.
func (o *demoOptions) crashAt() int {
	return int(float64(o.n) * o.crashAfter)
}

// crashJournal stands for the journal of a process that dies: once
// crashed, nothing more reaches the file, neither new entries nor, above
// all, the outcomes of the calls in flight, which stay pending as a kill
// would leave them. Their charges may or may not have been made.
type crashJournal struct {
	idemhttp.Journal
	crashed atomic.Bool
}

var errCrashed = errors.New("the process is gone")

// Begin writes nothing once crashed.
func (c *crashJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	if c.crashed.Load() {
		return nil, errCrashed
	}
	return c.Journal.Begin(ctx, e)
}

// Finish writes nothing once crashed: the outcome is lost.
func (c *crashJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	if c.crashed.Load() {
		return errCrashed
	}
	return c.Journal.Finish(ctx, key, o)
}

// demoIdemhttp runs the workload through idemhttp: a first run with a
// journal that crashes, then a second run that reopens the journal,
// resumes and sends the charges not done.
func demoIdemhttp(ctx context.Context, o *demoOptions, ops []demoOp, srv *idemtest.Server, st *demoStats) error {
	dir, err := os.MkdirTemp("", "idemctl-demo-")
	if err != nil {
		return fail(exitJournal, "demo: %v", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal")
	tr := newTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	cnt := &counter{rt: tr}
	defer func() { st.attempts = cnt.attempts.Load() }()
	// Each run is a new process: a new Client (and retry budget) over
	// the same journal file.
	newClient := func(j idemhttp.Journal) *idemhttp.Client {
		return &idemhttp.Client{
			HTTPClient: &http.Client{Transport: cnt, Timeout: o.timeout},
			Journal:    j,
			Policy:     &idemhttp.Policy{MaxAttempts: o.attempts, BaseDelay: 5 * time.Millisecond, MaxDelay: 100 * time.Millisecond},
			Hooks:      &idemtrace.Hooks{OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) { st.retry(ev.Reason) }},
		}
	}
	// Keys derived from the operation, as batch derives them: the secret
	// lives as long as the demo's journal, in its temporary folder.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret) // never fails (crypto/rand)
	send := func(c *idemhttp.Client) func(context.Context, demoOp) bool {
		return st.track(func(ctx context.Context, op demoOp) bool {
			key, err := idemhttp.DeriveKey(secret, op.id)
			if err != nil {
				return false
			}
			ctx = idemhttp.WithKey(idemhttp.WithOperation(ctx, op.id), key)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", bytes.NewReader(op.body))
			if err != nil {
				return false
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				return false
			}
			drainClose(resp)
			return resp.StatusCode < 300
		})
	}

	// Run 1, killed half way.
	fj, err := filejournal.Open(path, nil)
	if err != nil {
		return fail(exitJournal, "demo: %v", err)
	}
	cj := &crashJournal{Journal: fj}
	pool(ctx, ops, o.concurrency, o.crashAt(), func() { cj.crashed.Store(true) }, send(newClient(cj)))
	pending, err := fj.Pending(context.Background())
	if err != nil {
		_ = fj.Close()
		return fail(exitJournal, "demo: %v", err)
	}
	st.pendingAtCrash = len(pending)
	if err := fj.Close(); err != nil {
		return fail(exitJournal, "demo: %v", err)
	}

	// Run 2: reopen, resume, send what is not done.
	fj, err = filejournal.Open(path, nil)
	if err != nil {
		return fail(exitJournal, "demo: %v", err)
	}
	defer fj.Close()
	c := newClient(fj)
	rrs, err := c.Resume(ctx, nil)
	if err != nil && ctx.Err() == nil {
		return fail(exitJournal, "demo: resume: %v", err)
	}
	st.resumed = len(rrs)
	for _, rr := range rrs {
		if rr.Err == nil && rr.StatusCode < 300 {
			st.succeeded(rr.Entry.Operation)
		}
	}
	done, err := demoDone(fj)
	if err != nil {
		return err
	}
	var rest []demoOp
	for _, op := range ops {
		if !done[op.id] {
			rest = append(rest, op)
		}
	}
	st.rerun = len(rest)
	pool(ctx, rest, o.concurrency, 0, nil, send(c))
	if done, err = demoDone(fj); err != nil {
		return err
	}
	for _, op := range ops {
		if !done[op.id] {
			st.failed++
		}
	}
	return nil
}

// demoDone returns the charges the journal records as done with a 2xx.
func demoDone(fj *filejournal.Journal) (map[string]bool, error) {
	entries, err := fj.Entries(context.Background())
	if err != nil {
		return nil, fail(exitJournal, "demo: %v", err)
	}
	done := make(map[string]bool, len(entries))
	for _, en := range entries {
		if en.State == idemhttp.StateDone && en.LastStatus >= 200 && en.LastStatus < 300 {
			done[en.Operation] = true
		}
	}
	return done, nil
}

// drainClose reads the rest of resp's body, so the connection is reused,
// and closes it.
func drainClose(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes))
	resp.Body.Close()
}
