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
	fmt.Fprintf(w, "  %s 503 and %s bursts of 409, both with Retry-After %s", pct(f.Unavailable), pct(f.Conflict), f.RetryAfter)
	if f.MaxPerOperation > 0 {
		fmt.Fprintf(w, "; at most %d faults per charge", f.MaxPerOperation)
	}
	fmt.Fprintln(w)
	if n := o.crashAt(); n > 0 {
		fmt.Fprintf(w, "crash: after %d charges finish, the run is abandoned as a killed process leaves it; a second run then\n", n)
		fmt.Fprintf(w, "  resumes from the journal (idemhttp) or resends every charge it did not see succeed (the others)\n")
	}
	fmt.Fprintln(w)
}

// demoReasons is the order of the retry rows.
var demoReasons = []idemtrace.RetryReason{
	idemtrace.ReasonNotSent, idemtrace.ReasonUnknownOutcome, idemtrace.ReasonInProgress, idemtrace.ReasonRateLimited,
	idemtrace.ReasonUnavailable, idemtrace.ReasonServerError, idemtrace.ReasonShouldRetry,
}

// printDemoTable prints one column per client: labels left-aligned,
// numbers right-aligned under their client's name.
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
	row("requests the server saw", num(func(s *demoStats) int { return s.server.Requests }))
	row("replays of a stored response", num(func(s *demoStats) int { return s.server.Replays }))
	row("charges executed", num(func(s *demoStats) int { return s.executed }))
	row("  executions per charge", func(s *demoStats) string { return fmt.Sprintf("%.3f", float64(s.executed)/float64(s.ops)) })
	row("  duplicates", num(func(s *demoStats) int { return s.duplicates }))
	row("  lost (never executed)", num(func(s *demoStats) int { return s.lost }))
	row("charges the client saw fail", num(func(s *demoStats) int { return s.failed }))
	row("wall time", func(s *demoStats) string { return s.wall.Round(10 * time.Millisecond).String() })

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
		fmt.Fprintln(w, b.String())
	}
	fmt.Fprintln(w)
	if idem := cols[0]; o.crashAt() > 0 {
		fmt.Fprintf(w, "idemhttp: the crash left %d journal entries pending; the second run resumed them with their keys\n", idem.pendingAtCrash)
		fmt.Fprintf(w, "  and sent the %d charges not done.\n", idem.rerun)
	}
	for _, c := range cols {
		if c.name == "go-retryablehttp + Idempotency-Key" && o.crashAt() > 0 {
			fmt.Fprintf(w, "%s: its retries resend the key, but the rerun after the crash has no journal of the\n", c.name)
			fmt.Fprintf(w, "  first run's keys and mints new ones for the charges it did not see succeed: %d duplicates. The journal\n", c.duplicates)
			fmt.Fprintf(w, "  keeps each key across the crash, and resume resends it.\n")
		}
	}
	for _, c := range cols {
		if int64(c.server.Requests) > c.attempts {
			fmt.Fprintf(w, "%s: the server saw more requests than the client made attempts: net/http's Transport resends a\n", c.name)
			fmt.Fprintf(w, "  request carrying Idempotency-Key by itself when a reused connection dies first; with the key, that is harmless.\n")
		}
	}
	if o.faults.RetryAfter > 0 && (o.faults.Unavailable > 0 || o.faults.Conflict > 0) {
		fmt.Fprintf(w, "wall time: idemhttp waits as the server asks (Retry-After %s) on 503 and 409, and resumes 16 entries at a time;\n", o.faults.RetryAfter)
		fmt.Fprintf(w, "  go-retryablehttp honours Retry-After on 503 only, and net/http never retries.\n")
	}
}
