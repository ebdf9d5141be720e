package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress reports how far a run has got on stderr: a bar on a terminal,
// else a plain line now and then, which logs and CI keep readable. It also
// carries every other stderr message of the run, so a message never lands
// in the middle of the bar. Safe for concurrent use.
type progress struct {
	mu       sync.Mutex
	w        io.Writer
	bar      *progressbar.ProgressBar // nil: plain lines
	total    int
	counts   tally
	last     time.Time     // when the last plain line was printed
	interval time.Duration // between plain lines
	now      func() time.Time
	// label names what is counted in plain lines ("idemctl: progress"
	// by default); the demo names each client.
	label string
	// shared, when set, is a bar several reporters add to (the demo's
	// clients running at once); this one then prints nothing itself.
	shared *sharedBar
}

// sharedBar is one progress bar that several reporters add to. Safe for
// concurrent use.
type sharedBar struct {
	mu  sync.Mutex
	bar *progressbar.ProgressBar
}

func (s *sharedBar) add() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.bar.Add(1)
}

// finish removes the bar.
func (s *sharedBar) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.bar.Exit()
	_ = s.bar.Clear()
}

// newBar returns the bar progress shows on a terminal.
func newBar(w io.Writer, total int, description string) *progressbar.ProgressBar {
	return progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription(description),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}

// demoProgress reports the demo's clients, which run at once: a line
// per client now and then (each named), or one bar for all of them on a
// terminal.
type demoProgress struct {
	w        io.Writer
	mode     string
	total    int // charges per client
	shared   *sharedBar
	terminal bool
}

func newDemoProgress(w io.Writer, mode string, clients, total int, terminal bool) *demoProgress {
	d := &demoProgress{w: w, mode: mode, total: total, terminal: terminal}
	if mode == "bar" || (mode == "auto" && terminal) {
		d.shared = &sharedBar{bar: newBar(w, clients*total, fmt.Sprintf("charges (%d clients)", clients))}
	}
	return d
}

// column returns the reporter of one client.
func (d *demoProgress) column(name string) *progress {
	if d.shared != nil {
		p := newProgress(d.w, "none", d.total, false)
		p.shared = d.shared
		return p
	}
	p := newProgress(d.w, d.mode, d.total, false)
	p.label = "idemctl demo: " + name + ":"
	return p
}

// finish removes the shared bar; each column's final line was printed
// when it finished.
func (d *demoProgress) finish() {
	if d.shared != nil {
		d.shared.finish()
	}
}

// tally counts outcomes by kind.
type tally struct {
	ok, failed, pending int
	skipped             int // of those, done in an earlier run and not sent
	replayed            int // of those, answered by a replay
}

func (t tally) done() int { return t.ok + t.failed + t.pending }

// newProgress returns a progress reporter for total operations. mode is
// "auto" (a bar when w is a terminal), "bar", "lines" or "none".
func newProgress(w io.Writer, mode string, total int, terminal bool) *progress {
	p := &progress{w: w, total: total, interval: 2 * time.Second, now: time.Now, label: "idemctl:"}
	p.last = p.now()
	if mode == "bar" || (mode == "auto" && terminal) {
		p.bar = newBar(w, total, "operations")
	}
	if mode == "none" {
		p.interval = -1
	}
	return p
}

// add records one operation's outcome.
func (p *progress) add(r *result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch r.Result {
	case resultOK:
		p.counts.ok++
	case resultPending:
		p.counts.pending++
	default:
		p.counts.failed++
	}
	if r.Skipped {
		p.counts.skipped++
	}
	if r.Replayed {
		p.counts.replayed++
	}
	if p.shared != nil {
		p.shared.add()
		return
	}
	if p.bar != nil {
		_ = p.bar.Add(1)
		return
	}
	if p.interval >= 0 && p.now().Sub(p.last) >= p.interval {
		p.line()
	}
}

// line prints a plain progress line. The caller holds p.mu.
func (p *progress) line() {
	p.last = p.now()
	c := p.counts
	pct := 100
	if p.total > 0 {
		pct = 100 * c.done() / p.total
	}
	fmt.Fprintf(p.w, "%s progress %d/%d (%d%%): %d ok, %d failed, %d pending\n",
		p.label, c.done(), p.total, pct, c.ok, c.failed, c.pending)
}

// printf prints a message without breaking the bar.
func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Clear()
	}
	fmt.Fprintf(p.w, format, args...)
}

// finish removes the bar, or prints the last plain line.
func (p *progress) finish() tally {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bar != nil {
		_ = p.bar.Exit()
		_ = p.bar.Clear()
	} else if p.interval >= 0 && p.counts.done() > 0 {
		p.line()
	}
	return p.counts
}
