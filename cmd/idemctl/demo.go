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
temporary folder, and crashes half way: the charges in flight die, half
before their request left and half after the server answered, unrecorded,
as a killed process leaves them. A second run reopens the journal and, as
idemctl batch does, resends the pending charges with their keys beside
the rest. The same workload,
crash included, goes through plain net/http, go-retryablehttp (its
defaults, with a short timeout and tiny waits; no key, as most of its users
send), go-retryablehttp with an Idempotency-Key minted per call, and
go-retryablehttp with a key derived from the order id (HMAC-SHA256, no
journal: what a careful user writes by hand), each against a fresh server
with the same seed, at the same time; a table shows what each server
executed. The same seed and flags print the same table; the wall times
follow it. Progress goes to stderr: a bar on a terminal, plain lines
otherwise.

Exit code 1 if idemhttp shows a duplicate or lost charge.
`

// demoOptions are the demo's settings.
type demoOptions struct {
	n           int
	concurrency int
	faults      idemtest.Faults
	timeout     time.Duration // per attempt, for every client
	attempts    int           // idemhttp's MaxAttempts
	crashAfter  float64       // fraction of the charges the first run starts
	progress    string        // auto, bar, lines or none
}

func demoCommand(ctx context.Context, args []string, e env) error {
	o := &demoOptions{}
	fs := newFlagSet("demo", demoSynopsis, e)
	fs.IntVar(&o.n, "n", 500, "charges to send")
	fs.IntVar(&o.concurrency, "concurrency", 16, "charges in flight at once, per client")
	fs.Uint64Var(&o.faults.Seed, "seed", 1, "fault seed; the same seed gives every client the same faults, and prints the same table")
	fs.Float64Var(&o.faults.DropRequest, "drop-request", 0.05, "rate of requests lost before the server sees them")
	fs.Float64Var(&o.faults.DropResponse, "drop-response", 0.05, "rate of responses lost after the charge was made")
	fs.Float64Var(&o.faults.Slow, "slow", 0.03, "rate of replies slower than -timeout (the charge is made)")
	fs.Float64Var(&o.faults.Unavailable, "unavailable", 0.05, "rate of 503 with Retry-After")
	fs.Float64Var(&o.faults.Conflict, "conflict", 0.02, "rate of bursts of 409 (in progress) with Retry-After")
	fs.IntVar(&o.faults.ConflictBurst, "conflict-burst", 1, "409s in a burst")
	fs.IntVar(&o.faults.MaxPerOperation, "max-faults", 2, "faults injected into one charge at most (0: no cap)")
	fs.DurationVar(&o.faults.RetryAfter, "retry-after", time.Second, "Retry-After sent with 503 and 409, rounded up to seconds")
	fs.DurationVar(&o.timeout, "timeout", 500*time.Millisecond, "timeout of one attempt, for every client; slow replies take 4 times as long.\nThe same seed prints the same table as long as no normal reply takes this long (a machine loaded far beyond its cores)")
	fs.IntVar(&o.attempts, "attempts", 6, "idemhttp's attempts per charge")
	fs.Float64Var(&o.crashAfter, "crash-after", 0.5, "crash once this fraction of the charges has started (0: no crash)")
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
	case o.faults.ConflictBurst < 1:
		return fail(exitUsage, "-conflict-burst must be at least 1")
	case !(o.crashAfter >= 0 && o.crashAfter < 1):
		return fail(exitUsage, "-crash-after must be in [0, 1)")
	case o.progress != "auto" && o.progress != "bar" && o.progress != "lines" && o.progress != "none":
		return fail(exitUsage, "-progress must be auto, bar, lines or none")
	}
	for _, r := range []float64{o.faults.DropRequest, o.faults.DropResponse, o.faults.Slow, o.faults.Unavailable, o.faults.Conflict} {
		if !(r >= 0 && r <= 1) {
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
	// dies says how the crash ends this charge in the first run: not at
	// all, or (for the last charges it started, in flight at the crash)
	// before its request left or after the server answered.
	dies death
}

// death is how the crash ends a charge of the first run.
type death int

const (
	survives     death = iota
	diesUnsent         // the process dies after the journal's entry, before the request leaves
	diesAnswered       // the process dies after the server answered, before the client learns it
)

// demoOps returns the workload: n charges, of which the first run
// (crashing) starts the first crashAt; the last concurrency of those are
// in flight when it dies, alternately unsent and answered. Which charges
// die, and how, depends on nothing but the flags, so that the same seed
// gives the same table (a crash timed by the clock would not).
func demoOps(n, crashAt, concurrency int) []demoOp {
	ops := make([]demoOp, n)
	for i := range ops {
		id := fmt.Sprintf("charge-%04d", i)
		ops[i] = demoOp{id: id, body: fmt.Appendf(nil, `{"amount":%d,"currency":"usd","operation":%q}`, 1000+i, id)}
	}
	for i, k := max(crashAt-concurrency, 0), 0; i < crashAt; i, k = i+1, k+1 {
		ops[i].dies = diesUnsent + death(k%2)
	}
	return ops
}

// demoColumns are the clients of the table, in its order.
var demoColumns = []struct {
	name string
	run  func(context.Context, *demoOptions, []demoOp, *idemtest.Server, *demoStats) error
}{
	{"idemhttp", demoIdemhttp},
	{"net/http", demoPlain},
	{"retryablehttp", demoRetryable},
	{"+ random key", demoRetryableMinted},
	{"+ derived key", demoRetryableDerived},
}

// runDemo runs the columns at once, each against its own server, and
// prints the table. The clients spend their time waiting (for Retry-After,
// timeouts and backoff), not computing, so running them together barely
// changes any column's wall time and takes the longest column's instead
// of the sum; what the servers executed does not depend on timing at all.
func runDemo(ctx context.Context, o *demoOptions, e env) error {
	ops := demoOps(o.n, o.crashAt(), o.concurrency)
	printDemoHeader(e.stdout, o)
	prog := newDemoProgress(e.stderr, o.progress, len(demoColumns), o.n, e.isTerminal != nil && e.isTerminal(e.stderr))
	cols := make([]*demoStats, len(demoColumns))
	errs := make([]error, len(demoColumns))
	var wg sync.WaitGroup
	for i, col := range demoColumns {
		wg.Go(func() {
			cols[i], errs[i] = demoColumn(ctx, o, ops, col.name, prog.column(col.name), col.run)
		})
	}
	wg.Wait()
	prog.finish()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return &exitError{code: exitInterrupted, err: errors.New("interrupted")}
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
	if err != nil {
		return nil, err
	}
	st.wall = time.Since(start)
	// The charges that never succeeded are counted as failed now, once:
	// during the runs a failure may yet be retried by the second run.
	for range st.failed {
		prog.add(&result{Result: resultFailed})
	}
	prog.finish()
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

	// prog shows the charges the client has seen succeed, and at the end
	// those that failed. A charge failed in the first run and retried in
	// the second counts once, when it succeeds.
	prog *progress
	seen map[string]bool // charges already shown as succeeded; under mu

	server     idemtest.Stats
	executed   int // executions of the workload's charges
	duplicates int // executions beyond the first of a charge
	lost       int // charges never executed
	wall       time.Duration

	rerun int // charges the second run sent

	pendingAtCrash int // idemhttp only: entries the crash left pending
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

// succeeded shows the charge op as succeeded, once.
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

// pool sends ops with workers and returns which succeeded, in the order
// of ops. A charge that dies in the crash (op.dies) is sent with a
// context that the crash transport cancels (see crashTransport): the call
// ends as a killed process's would, and counts as not succeeded.
func pool(ctx context.Context, ops []demoOp, workers int, send func(context.Context, demoOp) bool) []bool {
	ok := make([]bool, len(ops))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, len(ops)) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= len(ops) {
					return
				}
				op := ops[i]
				if op.dies == survives {
					ok[i] = send(ctx, op)
					continue
				}
				cctx, cancel := context.WithCancel(ctx)
				send(context.WithValue(cctx, deathKey{}, &dying{how: op.dies, kill: cancel}), op)
				cancel()
			}
		})
	}
	wg.Wait()
	return ok
}

// crashAt is how many charges the first run starts before the crash, 0
// for no crash.
func (o *demoOptions) crashAt() int {
	return int(float64(o.n) * o.crashAfter)
}

// deathKey carries a *dying in the context of a charge the crash kills.
type deathKey struct{}

// dying is how a charge dies, and the function that ends its call.
type dying struct {
	how  death
	kill context.CancelFunc
}

func dyingOf(ctx context.Context) *dying {
	d, _ := ctx.Value(deathKey{}).(*dying)
	return d
}

var errCrashed = errors.New("the process is gone")

// crashTransport kills the charges the crash kills, at their first
// attempt: before the request leaves (nothing sent), or after the server
// answered (its answer discarded unread by the client). It then cancels
// the call's context, so no client retries: the process is gone.
type crashTransport struct{ rt http.RoundTripper }

func (t crashTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	d := dyingOf(r.Context())
	if d == nil {
		return t.rt.RoundTrip(r)
	}
	if d.how == diesAnswered {
		if resp, err := t.rt.RoundTrip(r); err == nil {
			drainClose(resp) // the server finished; the client never learns how
		}
	} else if r.Body != nil {
		r.Body.Close() // RoundTrip must close the body, even on error
	}
	d.kill()
	return nil, errCrashed
}

// crashJournal stands for the journal of a process that dies: nothing
// more reaches the file about a charge the crash kills, neither its
// outcome nor the withdrawal of an entry whose request never left; its
// entry stays pending as a kill leaves it. (The client calls the journal
// with the call's context, or one that keeps its values.)
type crashJournal struct {
	idemhttp.Journal
}

// Unwrap returns the journal c wraps, so that the client keeps that
// journal's rules (a file journal's: one process's) through c.
func (c crashJournal) Unwrap() idemhttp.Journal { return c.Journal }

// Finish writes nothing for a killed charge: the outcome is lost.
func (c crashJournal) Finish(ctx context.Context, key string, o idemhttp.Outcome) error {
	if dyingOf(ctx) != nil {
		return errCrashed
	}
	return c.Journal.Finish(ctx, key, o)
}

// Delete withdraws nothing for a killed charge: the process is gone.
func (c crashJournal) Delete(ctx context.Context, key string) error {
	if dyingOf(ctx) != nil {
		return errCrashed
	}
	return c.Journal.Delete(ctx, key)
}

// newDemoTransport returns a transport without keep-alives for one
// column, and the counter of its attempts above it. Without keep-alives,
// net/http never resends a keyed request by itself (it does when a reused
// connection dies before the answer), so every server sees the requests
// the clients made, and the same seed gives the same faults.
func newDemoTransport(concurrency int) (*http.Transport, *counter) {
	tr := newTransport(concurrency)
	tr.DisableKeepAlives = true
	return tr, &counter{rt: tr}
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
	tr, cnt := newDemoTransport(o.concurrency)
	defer tr.CloseIdleConnections()
	defer func() { st.attempts = cnt.attempts.Load() }()
	// Each run is a new process: a new Client (and retry budget) over
	// the same journal file.
	newClient := func(j idemhttp.Journal) *idemhttp.Client {
		return &idemhttp.Client{
			HTTPClient: &http.Client{Transport: crashTransport{cnt}, Timeout: o.timeout},
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

	// Run 1, killed once it has started crashAt charges.
	fj, err := filejournal.Open(path, nil)
	if err != nil {
		return fail(exitJournal, "demo: %v", err)
	}
	first := ops
	if n := o.crashAt(); n > 0 {
		first = ops[:n]
	}
	pool(ctx, first, o.concurrency, send(newClient(crashJournal{fj})))
	pending, err := fj.Pending(context.Background())
	if err != nil {
		_ = fj.Close()
		return fail(exitJournal, "demo: %v", err)
	}
	st.pendingAtCrash = len(pending)
	if err := fj.Close(); err != nil {
		return fail(exitJournal, "demo: %v", err)
	}

	// Run 2: reopen, and send every charge not done, as idemctl batch
	// does: Do under WithOperation finds a pending entry of the first run
	// and resends it with its key, beside the charges never begun.
	fj, err = filejournal.Open(path, nil)
	if err != nil {
		return fail(exitJournal, "demo: %v", err)
	}
	defer fj.Close()
	done, err := demoDone(fj)
	if err != nil {
		return err
	}
	var rest []demoOp
	for _, op := range ops {
		if !done[op.id] {
			op.dies = survives
			rest = append(rest, op)
		}
	}
	st.rerun = len(rest)
	pool(ctx, rest, o.concurrency, send(newClient(fj)))
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
