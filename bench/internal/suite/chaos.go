package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
)

// ChaosConfig configures [Chaos]. A zero field means the default in its
// comment.
type ChaosConfig struct {
	Peers       []string      // nil means [Peers]
	Ops         int           // operations per peer; 0 means 1000
	Concurrency int           // workers, each sending its next op when the last ends; 0 means 16
	Seed        uint64        // seeds the server's fault decisions
	Timeout     time.Duration // http.Client.Timeout, per attempt; 0 means 1 s
	Dialect     Dialect       // "" means DialectStripe

	// Faults are the injected faults; Seed replaces Faults.Seed. The zero
	// value means [ChaosFaults] for Timeout.
	Faults idemtest.Faults

	// Dir holds idemhttp's journal; "" means a new temporary directory,
	// removed afterwards.
	Dir string

	// ResumePasses bounds the Resume passes idemhttp makes after the run
	// while entries stay pending (faults go on during Resume); 0 means 3.
	ResumePasses int
}

// ChaosFaults returns the chaos mix: 10% of requests dropped before the
// server runs them, 10% dropped after it ran them (the reply is lost), 5%
// answered after twice timeout (slower than the client waits) and 5%
// refused with 503.
func ChaosFaults(timeout time.Duration) idemtest.Faults {
	return idemtest.Faults{
		DropRequest:  0.10,
		DropResponse: 0.10,
		Slow:         0.05,
		SlowDelay:    2 * timeout,
		Unavailable:  0.05,
	}
}

func (c ChaosConfig) withDefaults() ChaosConfig {
	if c.Peers == nil {
		c.Peers = Peers()
	}
	if c.Ops <= 0 {
		c.Ops = 1000
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Dialect == "" {
		c.Dialect = DialectStripe
	}
	if c.Faults.DropRequest == 0 && c.Faults.DropResponse == 0 && c.Faults.Slow == 0 &&
		c.Faults.Unavailable == 0 && c.Faults.Conflict == 0 && c.Faults.Stored500 == 0 && len(c.Faults.Outages) == 0 {
		c.Faults = ChaosFaults(c.Timeout)
	}
	c.Faults.Seed = c.Seed
	if c.ResumePasses <= 0 {
		c.ResumePasses = 3
	}
	return c
}

// ChaosResult is one peer's chaos run. Effects are counted by the server,
// per operation; failures are what the client reported (an error, or a
// final status that is not 2xx).
type ChaosResult struct {
	Peer string // the peer; the table's column, which a caller may relabel (a variant: "stripe-go (ietf errors)")
	Ops  int

	Ran0, Ran1, RanMore int // operations whose side effect ran never, once, more than once
	Duplicates          int // executions beyond the first, over all operations
	OKNotRun            int // reported success, never ran: lost silently
	Failures            int // reported failure
	FailuresRan         int // reported failure, yet ran

	Attempts int // the clients' own attempts, over all operations
	Resends  int // net/http's silent resends within those attempts
	Requests int // requests the server received

	P50, P99 time.Duration // latency of one operation, retries and waits included
	Wall     time.Duration // the whole run

	// Journaled is true for idemhttp, which ran with a FileJournal and
	// WithOperation; the fields below are set only then.
	Journaled bool
	// Pending is the entries left pending after the run: operations whose
	// outcome the client does not know, kept for Resume.
	Pending int
	// FailuresRanNotPending counts failures that ran but are not pending:
	// nothing would resend them, and nothing records that they ran.
	FailuresRanNotPending int
	// ResumePasses is how many Resume passes ran; Resumed counts the
	// entries they resent, PendingAfter those still pending after them.
	ResumePasses, Resumed, PendingAfter int
	// After Resume: effects per operation, and operations never run and
	// not pending (lost).
	AfterRan0, AfterRan1, AfterRanMore, AfterDuplicates, AfterLost int

	Server idemtest.Stats // the server's counters at the end
}

// AttemptsPerOp is the clients' attempts per operation.
func (r ChaosResult) AttemptsPerOp() float64 { return float64(r.Attempts) / float64(r.Ops) }

// Chaos runs cfg.Ops operations through each peer against a server that
// injects cfg.Faults, a fresh server per peer with the same seed, so every
// peer meets the same fault sequence per operation as long as it sends the
// same requests. It returns one result per peer, in cfg.Peers order.
func Chaos(ctx context.Context, cfg ChaosConfig) ([]ChaosResult, error) {
	cfg = cfg.withDefaults()
	dir, cleanup, err := workDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	out := make([]ChaosResult, 0, len(cfg.Peers))
	for _, name := range cfg.Peers {
		r, err := chaosPeer(ctx, name, cfg, dir)
		if err != nil {
			return out, fmt.Errorf("chaos %s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func chaosPeer(ctx context.Context, name string, cfg ChaosConfig, dir string) (ChaosResult, error) {
	opts, err := cfg.Dialect.options(cfg.Faults)
	if err != nil {
		return ChaosResult{}, err
	}
	srv := idemtest.NewServer(opts)
	defer srv.Close()

	pc := peerConfig{url: srv.URL, timeout: cfg.Timeout, count: true, withOp: true}
	var fj *filejournal.Journal
	if name == PeerIdem {
		path := filepath.Join(dir, "chaos-"+name+".journal")
		_ = os.Remove(path)
		fj, err = filejournal.Open(path, nil)
		if err != nil {
			return ChaosResult{}, err
		}
		defer fj.Close()
		pc.journal = fj
	}
	p, err := newPeer(name, pc)
	if err != nil {
		return ChaosResult{}, err
	}
	defer p.close()

	ops := opNames(cfg.Ops)
	begin := time.Now()
	results := runClosed(ctx, p, ops, cfg.Concurrency, nil)
	r := ChaosResult{Peer: name, Ops: len(ops), Wall: time.Since(begin)}
	executions := srv.Snapshot()
	e := countEffects(ops, executions)
	r.Ran0, r.Ran1, r.RanMore, r.Duplicates = e.ran0, e.ran1, e.ranMore, e.duplicates
	latencies := make([]time.Duration, len(results))
	for i, res := range results {
		latencies[i] = res.latency
		r.Attempts += res.attempts
		r.Resends += res.resends
		ran := executions[res.op] > 0
		switch {
		case res.ok() && !ran:
			r.OKNotRun++
		case !res.ok():
			r.Failures++
			if ran {
				r.FailuresRan++
			}
		}
	}
	r.P50, r.P99 = percentile(latencies, 50), percentile(latencies, 99)

	if fj != nil {
		if err := r.resume(ctx, p, fj, srv, ops, results, executions, cfg.ResumePasses); err != nil {
			return r, err
		}
	}
	r.Server = srv.Stats()
	r.Requests = r.Server.Requests
	return r, nil
}

// resume checks idemhttp's journal after the run, then resumes it.
func (r *ChaosResult) resume(ctx context.Context, p *peer, fj *filejournal.Journal, srv *idemtest.Server, ops []string, results []opResult, executions map[string]int, passes int) error {
	r.Journaled = true
	pending, err := pendingOps(ctx, fj)
	if err != nil {
		return err
	}
	r.Pending = len(pending)
	for _, res := range results {
		if !res.ok() && executions[res.op] > 0 && !pending[res.op] {
			r.FailuresRanNotPending++
		}
	}
	for range passes {
		if len(pending) == 0 {
			break
		}
		rr, err := p.idem.Resume(ctx, nil)
		if err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		r.ResumePasses++
		r.Resumed += len(rr)
		if pending, err = pendingOps(ctx, fj); err != nil {
			return err
		}
	}
	r.PendingAfter = len(pending)
	after := srv.Snapshot()
	e := countEffects(ops, after)
	r.AfterRan0, r.AfterRan1, r.AfterRanMore, r.AfterDuplicates = e.ran0, e.ran1, e.ranMore, e.duplicates
	for _, op := range ops {
		if after[op] == 0 && !pending[op] {
			r.AfterLost++
		}
	}
	return nil
}

// pendingOps returns the operations the journal holds as pending.
func pendingOps(ctx context.Context, j idemhttp.Journal) (map[string]bool, error) {
	entries, err := j.Pending(ctx)
	if err != nil {
		return nil, fmt.Errorf("journal pending: %w", err)
	}
	ops := make(map[string]bool, len(entries))
	for _, e := range entries {
		ops[e.Operation] = true
	}
	return ops, nil
}

// workDir returns dir, or a new temporary directory and its removal.
func workDir(dir string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	d, err := os.MkdirTemp("", "idembench-")
	if err != nil {
		return "", nil, err
	}
	return d, func() { _ = os.RemoveAll(d) }, nil
}
