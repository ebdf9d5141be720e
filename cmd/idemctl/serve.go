package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/idemtest"
)

const serveSynopsis = `Usage: idemctl serve [-addr 127.0.0.1:0] [fault flags]

Runs the fake Stripe-style payments API that idemhttp's tests use (package
idemtest) until SIGINT or SIGTERM, so that idemctl batch, a program of yours
or curl can be tried against it. It prints its URL first, on stdout:

  idemctl serve: listening on http://127.0.0.1:PORT

and what it counted (requests, side effects executed, duplicates, replays,
faults injected) every -stats-every, and once more when it stops.

Endpoints: POST /v1/charges creates a charge (parameters amount and
currency, as JSON or as a form); POST (or PUT, PATCH, DELETE) on any other
path performs a generic operation; GET and HEAD report status. Keys go in
Idempotency-Key: a retry with the same key and body gets the stored
response replayed (Idempotent-Replayed: true), never a second execution.
Each request belongs to an operation, named by the body's "operation"
member (or metadata[operation] in a form), else by its key: executions,
duplicates and fault decisions are counted per operation.

Faults are off unless a flag turns them on. Each rate is the probability
that a request gets that fault, drawn from -seed, the operation and its
request count, so the same seed and the same requests give the same faults.

Exit codes: 0 stopped by SIGINT or SIGTERM; 2 usage, or the address cannot
be listened on.
`

// serveOptions are the serve command's settings.
type serveOptions struct {
	addr       string
	faults     idemtest.Faults
	statsEvery time.Duration
	json       bool
	requireKey bool
	stripe     bool
}

func serveCommand(ctx context.Context, args []string, e env) error {
	o := &serveOptions{}
	fs := newFlagSet("serve", serveSynopsis, e)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:0", "`host:port` to listen on; port 0 picks a free one (printed)")
	fs.Uint64Var(&o.faults.Seed, "seed", 1, "fault seed: the same seed and the same requests give the same faults")
	fs.Float64Var(&o.faults.DropRequest, "drop-request", 0, "rate of requests dropped before the handler: the connection closes, nothing runs")
	fs.Float64Var(&o.faults.DropResponse, "drop-response", 0, "rate of responses dropped after the handler: the charge is made and stored, the connection closes")
	fs.Float64Var(&o.faults.Slow, "slow", 0, "rate of replies held for -slow-delay after the charge is made")
	fs.DurationVar(&o.faults.SlowDelay, "slow-delay", 2*time.Second, "how long a slow reply is held")
	fs.Float64Var(&o.faults.Unavailable, "unavailable", 0, "rate of 503 with Retry-After, before the handler")
	fs.Float64Var(&o.faults.Conflict, "conflict", 0, "rate of bursts of 409 \"in progress\" with Retry-After (never to an operation's first request)")
	fs.IntVar(&o.faults.ConflictBurst, "conflict-burst", 3, "409s in one burst")
	fs.Float64Var(&o.faults.Stored500, "stored-500", 0, "rate of 500s that are stored, and so replayed to every retry with the key, as Stripe does")
	fs.IntVar(&o.faults.MaxPerOperation, "max-faults", 0, "rated faults injected into one operation at most (0: no cap)")
	fs.DurationVar(&o.faults.RetryAfter, "retry-after", time.Second, "Retry-After sent with 503, 409 and 429, rounded up to seconds (0 sends 0)")
	fs.Float64Var(&o.faults.RateLimit, "rate-limit", 0, "requests a second served at most (a token bucket of -rate-burst); beyond it, 429 with Retry-After (0: no limit)")
	fs.IntVar(&o.faults.RateBurst, "rate-burst", 0, "the rate limit's bucket size; 0 means one second's worth")
	fs.DurationVar(&o.faults.Latency, "latency", 0, "delay before every request is served")
	fs.BoolVar(&o.requireKey, "require-key", false, "answer 400 to a POST or PATCH without Idempotency-Key")
	fs.BoolVar(&o.stripe, "stripe-errors", false, "errors as Stripe's: a reused key is 400 idempotency_error, with Stripe-Should-Retry")
	fs.DurationVar(&o.statsEvery, "stats-every", 0, "print the counts this often (0: only when stopping)")
	fs.BoolVar(&o.json, "json", false, "print the URL and the counts as JSON lines")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fail(exitUsage, "unexpected argument %q (flags only; see -h)", rest[0])
	}
	if err := o.validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fail(exitUsage, "-addr: %v", err)
	}
	return runServe(ctx, o, ln, e.stdout)
}

// validate checks the flags.
func (o *serveOptions) validate() error {
	f := &o.faults
	for _, r := range []struct {
		name string
		v    float64
	}{
		{"drop-request", f.DropRequest}, {"drop-response", f.DropResponse}, {"slow", f.Slow},
		{"unavailable", f.Unavailable}, {"conflict", f.Conflict}, {"stored-500", f.Stored500},
	} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return fail(exitUsage, "-%s must be between 0 and 1", r.name)
		}
	}
	switch {
	case f.DropRequest+f.DropResponse+f.Slow+f.Unavailable+f.Conflict+f.Stored500 > 1:
		return fail(exitUsage, "the fault rates add up to more than 1")
	case f.SlowDelay <= 0:
		return fail(exitUsage, "-slow-delay must be positive")
	case f.ConflictBurst < 1:
		return fail(exitUsage, "-conflict-burst must be at least 1")
	case f.MaxPerOperation < 0:
		return fail(exitUsage, "-max-faults must not be negative")
	case f.RetryAfter < 0:
		return fail(exitUsage, "-retry-after must not be negative")
	case !(f.RateLimit >= 0) || f.RateLimit > 1e9:
		return fail(exitUsage, "-rate-limit must be a number of requests a second, 0 for no limit")
	case f.RateBurst < 0:
		return fail(exitUsage, "-rate-burst must not be negative")
	case f.Latency < 0:
		return fail(exitUsage, "-latency must not be negative")
	case o.statsEvery < 0:
		return fail(exitUsage, "-stats-every must not be negative")
	}
	return nil
}

// runServe serves on ln until ctx is done (a signal), printing the URL
// first, the counts every o.statsEvery, and the final counts once every
// request in flight has ended.
func runServe(ctx context.Context, o *serveOptions, ln net.Listener, w io.Writer) error {
	srv := idemtest.NewServer(&idemtest.Options{
		Listener:     ln,
		Faults:       o.faults,
		RequireKey:   o.requireKey,
		StripeErrors: o.stripe,
	})
	p := &servePrinter{w: w, json: o.json, start: time.Now()}
	p.url(srv.URL)
	if o.statsEvery > 0 {
		t := time.NewTicker(o.statsEvery)
		defer t.Stop()
	loop:
		for {
			select {
			case <-t.C:
				p.stats("running", srv.Stats())
			case <-ctx.Done():
				break loop
			}
		}
	} else {
		<-ctx.Done()
	}
	srv.Close() // ends slow replies and waits for the requests in flight
	p.stats("stopped", srv.Stats())
	return nil
}

// servePrinter writes serve's lines, as text or JSON. Safe for
// concurrent use.
type servePrinter struct {
	mu    sync.Mutex
	w     io.Writer
	json  bool
	start time.Time
}

// serveStats is one counts line as JSON: the names of idemtest.Stats in
// idemctl's JSON spelling.
type serveStats struct {
	State      string         `json:"state"` // running or stopped
	Uptime     string         `json:"uptime"`
	Requests   int            `json:"requests"`
	Executions int            `json:"executions"`
	Operations int            `json:"operations"`
	Duplicates int            `json:"duplicates"`
	Replays    int            `json:"replays"`
	Conflicts  int            `json:"conflicts"`
	Mismatches int            `json:"mismatches"`
	Faults     map[string]int `json:"faults"`
}

func (p *servePrinter) url(u string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		p.encode(map[string]string{"url": u})
		return
	}
	fmt.Fprintf(p.w, "idemctl serve: listening on %s\n", u)
}

func (p *servePrinter) stats(state string, st idemtest.Stats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	up := time.Since(p.start).Round(time.Second).String()
	if !p.json {
		fmt.Fprintf(p.w, "idemctl serve: %s after %s: %s\n", state, up, st)
		return
	}
	v := serveStats{
		State: state, Uptime: up, Requests: st.Requests, Executions: st.Executions, Operations: st.Operations,
		Duplicates: st.Duplicates, Replays: st.Replays, Conflicts: st.Conflicts, Mismatches: st.Mismatches,
		Faults: make(map[string]int, len(st.Faults)),
	}
	for k, n := range st.Faults {
		v.Faults[string(k)] = n
	}
	p.encode(v)
}

// encode writes v as one JSON line; the caller holds p.mu. A failed write
// (stdout closed) is not worth stopping the server for.
func (p *servePrinter) encode(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // unreachable: plain strings and ints
	}
	_, _ = p.w.Write(append(b, '\n'))
}
