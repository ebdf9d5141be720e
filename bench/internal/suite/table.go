package suite

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Report is the results of one run of the suite. A nil slice is a
// scenario that did not run; the configs title the sections.
type Report struct {
	Overhead       []OverheadResult
	OverheadConfig OverheadConfig

	Chaos       []ChaosResult
	ChaosConfig ChaosConfig

	Outage       []OutageResult
	OutageConfig OutageConfig

	Crash       []CrashResult
	CrashConfig CrashConfig

	Journal       []JournalResult
	JournalConfig JournalConfig
}

// Table renders the report as one Markdown table: a column per peer, a row
// per measure, a bold row per scenario. "-" marks a measure that does not
// apply to a peer.
func (r Report) Table() string {
	t := newTable(r.peers())
	r.overheadRows(t)
	r.chaosRows(t)
	r.outageRows(t)
	r.crashRows(t)
	r.journalRows(t)
	return t.String()
}

// peers returns the column of every result, in table order: by peer as
// [Peers] orders them (PeerRawKey after PeerRaw), a variant of a peer
// ("stripe-go (ietf errors)", a label whose first word is the peer's name)
// after the peer itself.
func (r Report) peers() []string {
	var labels []string
	add := func(l string) {
		if !slices.Contains(labels, l) {
			labels = append(labels, l)
		}
	}
	for _, x := range r.Overhead {
		add(x.Peer)
	}
	for _, x := range r.Chaos {
		add(x.Peer)
	}
	for _, x := range r.Outage {
		add(x.Peer)
	}
	for _, x := range r.Crash {
		add(x.Peer)
	}
	if r.Journal != nil {
		add(PeerIdem)
	}
	order := []string{PeerRaw, PeerRawKey, PeerRetryable, PeerStripe, PeerIdem}
	rank := func(label string) int {
		base, _, variant := strings.Cut(label, " ")
		i := slices.Index(order, base)
		if i < 0 {
			i = len(order)
		}
		if variant {
			return 2*i + 1
		}
		return 2 * i
	}
	slices.SortStableFunc(labels, func(a, b string) int { return rank(a) - rank(b) })
	return labels
}

func (r Report) overheadRows(t *table) {
	if r.Overhead == nil {
		return
	}
	cfg := r.OverheadConfig
	if cfg.Runs <= 0 {
		cfg.Runs = 60
	}
	timeout := "timeout 1s"
	switch {
	case cfg.Timeout > 0:
		timeout = "timeout " + cfg.Timeout.String()
	case cfg.Timeout < 0:
		timeout = "no timeout"
	}
	t.section(fmt.Sprintf("Overhead: one POST at a time, %s, median of %d interleaved runs", timeout, cfg.Runs))
	cell := func(f func(OverheadResult) string) func(string) string {
		return func(peer string) string {
			for _, x := range r.Overhead {
				if x.Peer == peer {
					return f(x)
				}
			}
			return "-"
		}
	}
	t.row("ns/op (round trip)", cell(func(x OverheadResult) string { return fmt.Sprintf("%.0f", x.NsPerOp) }))
	t.row("ns/op ÷ raw (median of per-round ratios)", cell(func(x OverheadResult) string { return fmt.Sprintf("%.2fx", x.Ratio) }))
	t.row("… quartiles of the per-round ratios", cell(func(x OverheadResult) string { return fmt.Sprintf("%.2f–%.2f", x.RatioQ1, x.RatioQ3) }))
	t.row("allocs/op (client)", cell(func(x OverheadResult) string { return fmt.Sprintf("%.0f", x.AllocsPerOp) }))
	t.row("B/op (client)", cell(func(x OverheadResult) string { return fmt.Sprintf("%.0f", x.BytesPerOp) }))
	t.row("goroutines started/op (client)", cell(func(x OverheadResult) string { return fmt.Sprintf("%.2f", x.Goroutines) }))
	t.row("CPU ns/op, server process", cell(func(x OverheadResult) string { return fmt.Sprintf("%.0f", x.ServerCPU) }))
	t.row("client alone (no network, no timeout, 1 CPU): CPU ns/op", cell(func(x OverheadResult) string { return fmt.Sprintf("%.0f", x.AloneCPU) }))
	t.row("client alone ÷ raw", cell(func(x OverheadResult) string { return fmt.Sprintf("%.2fx", x.AloneRatio) }))
}

func (r Report) chaosRows(t *table) {
	if r.Chaos == nil {
		return
	}
	cfg := r.ChaosConfig.withDefaults()
	f := cfg.Faults
	t.section(fmt.Sprintf("Chaos: %d ops, concurrency %d, timeout %s; drop request %s, drop response %s, slow %s, 503 %s; seed %d, %s errors",
		cfg.Ops, cfg.Concurrency, cfg.Timeout, pct(f.DropRequest), pct(f.DropResponse), pct(f.Slow), pct(f.Unavailable), cfg.Seed, cfg.Dialect))
	cell := func(f func(ChaosResult) string) func(string) string {
		return func(peer string) string {
			for _, x := range r.Chaos {
				if x.Peer == peer {
					return f(x)
				}
			}
			return "-"
		}
	}
	journaled := func(f func(ChaosResult) string) func(string) string {
		return cell(func(x ChaosResult) string {
			if !x.Journaled {
				return "-"
			}
			return f(x)
		})
	}
	t.row("side effect ran 0 / 1 / >1 times", cell(func(x ChaosResult) string { return fmt.Sprintf("%d / %d / %d", x.Ran0, x.Ran1, x.RanMore) }))
	t.row("duplicate executions", cell(func(x ChaosResult) string { return fmt.Sprint(x.Duplicates) }))
	t.row("reported ok, never ran", cell(func(x ChaosResult) string { return fmt.Sprint(x.OKNotRun) }))
	t.row("reported failed", cell(func(x ChaosResult) string { return fmt.Sprint(x.Failures) }))
	t.row("reported failed, yet ran", cell(func(x ChaosResult) string { return fmt.Sprint(x.FailuresRan) }))
	t.row("… of those, pending in journal", journaled(func(x ChaosResult) string {
		return fmt.Sprint(x.FailuresRan - x.FailuresRanNotPending)
	}))
	t.row("attempts/op (client)", cell(func(x ChaosResult) string { return fmt.Sprintf("%.2f", x.AttemptsPerOp()) }))
	t.row("net/http silent resends", cell(func(x ChaosResult) string { return fmt.Sprint(x.Resends) }))
	t.row("requests the server got", cell(func(x ChaosResult) string { return fmt.Sprint(x.Requests) }))
	t.row("latency p50 / p99", cell(func(x ChaosResult) string { return dur(x.P50) + " / " + dur(x.P99) }))
	t.row("pending in journal after run", journaled(func(x ChaosResult) string { return fmt.Sprint(x.Pending) }))
	t.row("after Resume: ran 0 / 1 / >1; pending", journaled(func(x ChaosResult) string {
		return fmt.Sprintf("%d / %d / %d; %d", x.AfterRan0, x.AfterRan1, x.AfterRanMore, x.PendingAfter)
	}))
	t.row("wall time", cell(func(x ChaosResult) string { return dur(x.Wall) }))
}

func (r Report) outageRows(t *table) {
	if r.Outage == nil {
		return
	}
	cfg := r.OutageConfig.withDefaults()
	t.section(fmt.Sprintf("Full outage: every request 503 (Retry-After %s) from %s to %s; %d ops arriving evenly over %s, timeout %s",
		cfg.RetryAfter, cfg.Start, cfg.Start+cfg.Length, cfg.Ops, cfg.Span, cfg.Timeout))
	cell := func(f func(OutageResult) string) func(string) string {
		return func(peer string) string {
			for _, x := range r.Outage {
				if x.Peer == peer {
					return f(x)
				}
			}
			return "-"
		}
	}
	inOutage := 0
	if len(r.Outage) > 0 {
		inOutage = r.Outage[0].InOutage
	}
	t.row(fmt.Sprintf("attempts/op, the %d ops arriving during the outage", inOutage), cell(func(x OutageResult) string { return fmt.Sprintf("%.2f", x.InOutagePerOp()) }))
	t.row("attempts/op, all ops", cell(func(x OutageResult) string { return fmt.Sprintf("%.2f", x.AttemptsPerOp()) }))
	t.row("requests the server got (refused)", cell(func(x OutageResult) string { return fmt.Sprintf("%d (%d)", x.Requests, x.Refused) }))
	t.row("reported failed", cell(func(x OutageResult) string { return fmt.Sprint(x.Failures) }))
}

func (r Report) crashRows(t *table) {
	if r.Crash == nil {
		return
	}
	cfg := r.CrashConfig.withDefaults()
	t.section(fmt.Sprintf("Crash and restart: %d ops, concurrency %d, replies %s after commit; SIGKILL after %d ops done (seed %d), rerun skipping the done-file",
		cfg.Ops, cfg.Concurrency, cfg.Latency, cfg.KillPoint(), cfg.Seed))
	cell := func(f func(CrashResult) string) func(string) string {
		return func(peer string) string {
			for _, x := range r.Crash {
				if x.Peer == peer {
					return f(x)
				}
			}
			return "-"
		}
	}
	t.row("ran but not in done-file at the kill", cell(func(x CrashResult) string { return fmt.Sprint(x.InFlight) }))
	t.row("resent by Resume on restart", cell(func(x CrashResult) string {
		if x.Peer != PeerIdem {
			return "-"
		}
		return fmt.Sprint(x.Resumed)
	}))
	t.row("after rerun: ran 0 / 1 / >1 times", cell(func(x CrashResult) string { return fmt.Sprintf("%d / %d / %d", x.Ran0, x.Ran1, x.RanMore) }))
	t.row("duplicate executions after rerun", cell(func(x CrashResult) string { return fmt.Sprint(x.Duplicates) }))
}

func (r Report) journalRows(t *table) {
	if r.Journal == nil {
		return
	}
	cfg := r.JournalConfig.withDefaults()
	t.section(fmt.Sprintf("Journal cost: FileJournal commits (each a write and sync) per request, %d ops, no faults", cfg.Ops))
	for _, x := range r.Journal {
		t.row(fmt.Sprintf("syncs/request, concurrency %d", x.Concurrency), func(peer string) string {
			if peer != PeerIdem {
				return "-"
			}
			return fmt.Sprintf("%.2f (p50 %s, %s/op)", x.SyncsPerRequest(), dur(x.P50), dur(x.PerOp))
		})
	}
}

// table is a Markdown table under construction.
type table struct {
	cols []string
	rows [][]string // a row of one cell is a section title
}

func newTable(peers []string) *table {
	return &table{cols: append([]string{"measure"}, peers...)}
}

func (t *table) section(title string) { t.rows = append(t.rows, []string{"**" + title + "**"}) }

func (t *table) row(measure string, cell func(peer string) string) {
	r := []string{measure}
	for _, p := range t.cols[1:] {
		r = append(r, cell(p))
	}
	t.rows = append(t.rows, r)
}

// String renders the table, cells padded so that it reads as text too. A
// section title spans the measure column alone (Markdown has no colspan).
func (t *table) String() string {
	widths := make([]int, len(t.cols))
	for i, c := range t.cols {
		widths[i] = len([]rune(c))
	}
	for _, r := range t.rows {
		if len(r) == 1 {
			continue // titles do not widen the column
		}
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for i := range t.cols {
			c := ""
			if i < len(cells) {
				c = cells[i]
			}
			b.WriteString(" " + c + strings.Repeat(" ", max(widths[i]-len([]rune(c)), 0)) + " |")
		}
		b.WriteString("\n")
	}
	line(t.cols)
	sep := make([]string, len(t.cols))
	for i := range sep {
		sep[i] = strings.Repeat("-", widths[i])
		if i > 0 {
			sep[i] = sep[i][:len(sep[i])-1] + ":"
		}
	}
	line(sep)
	for _, r := range t.rows {
		line(slices.Clone(r))
	}
	return b.String()
}

// pct renders a rate as a percentage.
func pct(f float64) string { return fmt.Sprintf("%g%%", f*100) }

// dur renders d with three significant figures or so.
func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}
