package suite

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idemhttp/idemtest"
)

// OutageConfig configures [Outage]. A zero field means the default in its
// comment.
type OutageConfig struct {
	Peers []string // nil means [Peers]
	Ops   int      // operations per peer; 0 means 1000

	// Span is the time over which operations arrive, evenly spaced, each
	// on its own goroutine whatever the others are doing; 0 means 4 s.
	Span time.Duration

	// Start and Length place the outage, measured from the first arrival;
	// 0 means 0.5 s and 3 s. Every request inside it gets 503.
	Start, Length time.Duration

	// RetryAfter is sent with the outage's 503s; 0 means 1 s, a negative
	// value sends "Retry-After: 0".
	RetryAfter time.Duration

	Timeout time.Duration // http.Client.Timeout, per attempt; 0 means 1 s
	Dialect Dialect       // "" means DialectStripe
}

func (c OutageConfig) withDefaults() OutageConfig {
	if c.Peers == nil {
		c.Peers = Peers()
	}
	if c.Ops <= 0 {
		c.Ops = 1000
	}
	if c.Span <= 0 {
		c.Span = 4 * time.Second
	}
	if c.Start <= 0 {
		c.Start = 500 * time.Millisecond
	}
	if c.Length <= 0 {
		c.Length = 3 * time.Second
	}
	switch {
	case c.RetryAfter == 0:
		c.RetryAfter = time.Second
	case c.RetryAfter < 0:
		c.RetryAfter = 0
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.Dialect == "" {
		c.Dialect = DialectStripe
	}
	return c
}

// OutageResult is one peer's outage run.
type OutageResult struct {
	Peer string // the peer; the table's column, which a caller may relabel (a variant: "stripe-go (ietf errors)")
	Ops  int

	Attempts int // the client's attempts, over all operations
	Resends  int // net/http's silent resends within them

	// InOutage counts the operations that arrived during the outage, and
	// InOutageAttempts their attempts: the amplification a down server
	// sees while it is down.
	InOutage, InOutageAttempts int

	Failures   int // reported failure
	Duplicates int // executions beyond the first
	Requests   int // requests the server received
	Refused    int // of which refused by the outage
	Wall       time.Duration
}

// AttemptsPerOp is the attempts per operation over the whole run.
func (r OutageResult) AttemptsPerOp() float64 { return float64(r.Attempts) / float64(r.Ops) }

// InOutagePerOp is the attempts per operation that arrived during the
// outage.
func (r OutageResult) InOutagePerOp() float64 {
	if r.InOutage == 0 {
		return 0
	}
	return float64(r.InOutageAttempts) / float64(r.InOutage)
}

// Outage sends cfg.Ops operations through each peer, arriving at a steady
// rate, to a server that refuses everything with 503 for cfg.Length, and
// counts attempts: the load a client fleet adds to a server that is down.
// Each peer gets a fresh server and a fresh client, so idemhttp's retry
// budget starts full.
func Outage(ctx context.Context, cfg OutageConfig) ([]OutageResult, error) {
	cfg = cfg.withDefaults()
	out := make([]OutageResult, 0, len(cfg.Peers))
	for _, name := range cfg.Peers {
		r, err := outagePeer(ctx, name, cfg)
		if err != nil {
			return out, fmt.Errorf("outage %s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func outagePeer(ctx context.Context, name string, cfg OutageConfig) (OutageResult, error) {
	opts, err := cfg.Dialect.options(idemtest.Faults{
		Outages:    []idemtest.Window{{Start: cfg.Start, End: cfg.Start + cfg.Length}},
		RetryAfter: cfg.RetryAfter,
	})
	if err != nil {
		return OutageResult{}, err
	}
	srv := idemtest.NewServer(opts)
	defer srv.Close()
	p, err := newPeer(name, peerConfig{url: srv.URL, timeout: cfg.Timeout, count: true})
	if err != nil {
		return OutageResult{}, err
	}
	defer p.close()

	ops := opNames(cfg.Ops)
	begin := time.Now()
	results := runOpen(ctx, p, ops, cfg.Span/time.Duration(cfg.Ops))
	r := OutageResult{Peer: name, Ops: len(ops), Wall: time.Since(begin)}
	for _, res := range results {
		r.Attempts += res.attempts
		r.Resends += res.resends
		if !res.ok() {
			r.Failures++
		}
		if res.start >= cfg.Start && res.start < cfg.Start+cfg.Length {
			r.InOutage++
			r.InOutageAttempts += res.attempts
		}
	}
	st := srv.Stats()
	r.Duplicates, r.Requests, r.Refused = st.Duplicates, st.Requests, st.Faults[idemtest.FaultOutage]
	return r, nil
}
