package suite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
)

// JournalConfig configures [JournalCost]. A zero field means the default
// in its comment.
type JournalConfig struct {
	Ops         int   // operations per concurrency; 0 means 500
	Concurrency []int // nil means 1, 16 and 64

	// Dir holds the journals; "" means a new temporary directory, removed
	// afterwards. Its file system decides what a sync costs.
	Dir string
}

func (c JournalConfig) withDefaults() JournalConfig {
	if c.Ops <= 0 {
		c.Ops = 500
	}
	if c.Concurrency == nil {
		c.Concurrency = []int{1, 16, 64}
	}
	return c
}

// JournalResult is what durability cost idemhttp at one concurrency.
type JournalResult struct {
	Concurrency int
	Requests    int           // requests the server received
	Writes      uint64        // journal writes (a Begin and a Finish per request)
	Commits     uint64        // journal commits: each one write-and-sync of the file
	PerOp       time.Duration // wall time over operations: the inverse of throughput
	P50, P99    time.Duration // latency of one operation
}

// SyncsPerRequest is commits per request: about 1 for a lone caller
// (each entry waits for its own commit before the request is sent; the
// outcome is written behind and starts no commit, so it goes with the
// next entry's), less when concurrent calls share commits.
func (r JournalResult) SyncsPerRequest() float64 {
	return float64(r.Commits) / float64(r.Requests)
}

// JournalCost sends cfg.Ops operations through idemhttp with a fresh
// FileJournal at each concurrency, to a server without faults, and counts
// the journal's commits per request.
func JournalCost(ctx context.Context, cfg JournalConfig) ([]JournalResult, error) {
	cfg = cfg.withDefaults()
	dir, cleanup, err := workDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	out := make([]JournalResult, 0, len(cfg.Concurrency))
	for _, c := range cfg.Concurrency {
		r, err := journalAt(ctx, c, cfg.Ops, filepath.Join(dir, "cost-"+strconv.Itoa(c)+".journal"))
		if err != nil {
			return out, fmt.Errorf("journal cost at concurrency %d: %w", c, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func journalAt(ctx context.Context, concurrency, ops int, path string) (JournalResult, error) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	_ = os.Remove(path)
	fj, err := filejournal.Open(path, nil)
	if err != nil {
		return JournalResult{}, err
	}
	defer fj.Close()
	p, err := newPeer(PeerIdem, peerConfig{url: srv.URL, timeout: 10 * time.Second, journal: fj, withOp: true})
	if err != nil {
		return JournalResult{}, err
	}
	defer p.close()
	begin := time.Now()
	results := runClosed(ctx, p, opNames(ops), concurrency, nil)
	wall := time.Since(begin)
	latencies := make([]time.Duration, len(results))
	for i, res := range results {
		if !res.ok() {
			return JournalResult{}, fmt.Errorf("%s failed: status %d: %w", res.op, res.status, res.err)
		}
		latencies[i] = res.latency
	}
	// Outcomes are written behind: count the commits that make the last
	// ones durable too.
	if err := fj.Sync(ctx); err != nil {
		return JournalResult{}, err
	}
	st := fj.Stats()
	return JournalResult{
		Concurrency: concurrency,
		Requests:    srv.Stats().Requests,
		Writes:      st.Writes,
		Commits:     st.Commits,
		PerOp:       wall / time.Duration(ops),
		P50:         percentile(latencies, 50),
		P99:         percentile(latencies, 99),
	}, nil
}
