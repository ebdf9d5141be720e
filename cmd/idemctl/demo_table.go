package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
)

// printDemoHeader says what the demo does, with the numbers it uses.
func printDemoHeader(w io.Writer, o *demoOptions) {
	f := o.faults
	pct := func(r float64) string { return fmt.Sprintf("%g%%", r*100) }
	fmt.Fprintf(w, "idemctl demo: %d charges, %d at a time, against a fake payments API (idemtest) on loopback, seed %d\n", o.n, o.concurrency, f.Seed)
	fmt.Fprintf(w, "faults per request: %s lost requests, %s lost responses (after the charge is made), %s slow replies (%s, timeout %s),\n",
		pct(f.DropRequest), pct(f.DropResponse), pct(f.Slow), f.SlowDelay, o.timeout)
	burst := "409s"
	if f.ConflictBurst == 1 {
		burst = "409"
	}
	fmt.Fprintf(w, "  %s 503 and %s bursts of %d %s, both with Retry-After %s", pct(f.Unavailable), pct(f.Conflict), f.ConflictBurst, burst, f.RetryAfter)
	if f.MaxPerOperation > 0 {
		fmt.Fprintf(w, "; at most %d faults per charge", f.MaxPerOperation)
	}
	fmt.Fprintln(w)
	if n := o.crashAt(); n > 0 {
		inflight := min(o.concurrency, n)
		fmt.Fprintf(w, "crash: once the first run has started %d charges, it dies with the last %d in flight (half before their request left,\n", n, inflight)
		fmt.Fprintf(w, "  half after the server answered), unrecorded; a second run then resends the journal's pending charges with their\n")
		fmt.Fprintf(w, "  keys (idemhttp) or every charge it did not see succeed (the others), and sends the rest\n")
	}
	fmt.Fprintln(w)
}

// demoReasons is the order of the retry rows.
var demoReasons = []idemtrace.RetryReason{
	idemtrace.ReasonNotSent, idemtrace.ReasonUnknownOutcome, idemtrace.ReasonInProgress, idemtrace.ReasonRateLimited,
	idemtrace.ReasonUnavailable, idemtrace.ReasonServerError, idemtrace.ReasonShouldRetry,
}

// printDemoTable prints one column per client: labels left-aligned,
// numbers right-aligned under their client's name. Everything in it is
// decided by the flags and the seed; the wall times, which are not, follow
// it.
func printDemoTable(w io.Writer, o *demoOptions, cols []*demoStats) {
	type line struct {
		label string
		cells []string
	}
	var lines []line
	row := func(label string, cell func(*demoStats) string) {
		l := line{label: label}
		for _, c := range cols {
			l.cells = append(l.cells, cell(c))
		}
		lines = append(lines, l)
	}
	num := func(f func(*demoStats) int) func(*demoStats) string {
		return func(s *demoStats) string { return fmt.Sprint(f(s)) }
	}
	row("", func(s *demoStats) string { return s.name })
	row("charges", num(func(s *demoStats) int { return s.ops }))
	row("attempts", num(func(s *demoStats) int { return int(s.attempts) }))
	row("retries", num(func(s *demoStats) int {
		n := 0
		for _, v := range s.retries {
			n += v
		}
		return n
	}))
	for _, r := range demoReasons {
		seen := false
		for _, c := range cols {
			seen = seen || c.retries[r] > 0
		}
		if seen {
			row("  "+string(r), num(func(s *demoStats) int { return s.retries[r] }))
		}
	}
	if o.crashAt() > 0 {
		row("first-run charges sent again", num(func(s *demoStats) int { return s.rerun - (s.ops - o.crashAt()) }))
	}
	row("requests the server saw", num(func(s *demoStats) int { return s.server.Requests }))
	row("replays of a stored response", num(func(s *demoStats) int { return s.server.Replays }))
	row("charges executed", num(func(s *demoStats) int { return s.executed }))
	row("  executions per charge", func(s *demoStats) string { return fmt.Sprintf("%.3f", float64(s.executed)/float64(s.ops)) })
	row("  duplicates", num(func(s *demoStats) int { return s.duplicates }))
	row("  lost (never executed)", num(func(s *demoStats) int { return s.lost }))
	row("charges the client saw fail", num(func(s *demoStats) int { return s.failed }))

	labelW := 0
	cellW := make([]int, len(cols))
	for _, l := range lines {
		labelW = max(labelW, len(l.label))
		for i, c := range l.cells {
			cellW[i] = max(cellW[i], len(c))
		}
	}
	for _, l := range lines {
		var b strings.Builder
		fmt.Fprintf(&b, "%-*s", labelW, l.label)
		for i, c := range l.cells {
			fmt.Fprintf(&b, "   %*s", cellW[i], c)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "retryablehttp: hashicorp/go-retryablehttp, its default retry policy, no key, as most of its users send;")
	fmt.Fprintln(w, "  + random key: with an Idempotency-Key minted per call; + derived key: with HMAC-SHA256(secret, order id)")
	fmt.Fprintln(w, "  as the key, written by hand, no journal.")
	if idem := cols[0]; o.crashAt() > 0 {
		fmt.Fprintf(w, "idemhttp: the crash left %d journal entries pending; the second run resent them with their keys\n", idem.pendingAtCrash)
		fmt.Fprintf(w, "  beside the %d charges never begun.\n", idem.rerun-idem.pendingAtCrash)
		for _, c := range cols {
			switch c.name {
			case "+ random key":
				fmt.Fprintf(w, "%s: its retries resend the key, but the rerun after the crash has no journal of the first run's keys\n", c.name)
				fmt.Fprintf(w, "  and mints new ones for the charges it did not see succeed: %d duplicates.\n", c.duplicates)
			case "+ derived key":
				fmt.Fprintf(w, "%s: the rerun derives the same keys, so the server replays what the first run did: %d duplicates.\n", c.name, c.duplicates)
				fmt.Fprintf(w, "  What no journal gives it: a rerun after the server forgot the keys (24 h at Stripe) runs every charge again,\n")
				fmt.Fprintf(w, "  a changed body under the same key is refused by the server (422) rather than resent as first sent, and\n")
				fmt.Fprintf(w, "  nothing lists what is pending: the rerun resends all it did not see succeed (README: \"What a derived key does not give\").\n")
			}
		}
	}
	if o.faults.RetryAfter > 0 && (o.faults.Unavailable > 0 || o.faults.Conflict > 0) {
		fmt.Fprintf(w, "idemhttp waits as the server asks (Retry-After %s) on 503 and 409; go-retryablehttp honours Retry-After on\n", o.faults.RetryAfter)
		fmt.Fprintf(w, "  503 only and does not retry a 409, and net/http never retries.\n")
	}
	fmt.Fprintln(w)
	var walls []string
	for _, c := range cols {
		walls = append(walls, fmt.Sprintf("%s %s", c.name, c.wall.Round(10*time.Millisecond)))
	}
	fmt.Fprintf(w, "wall time (the clients ran at once): %s\n", strings.Join(walls, ", "))
}
