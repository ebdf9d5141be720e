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
	p := &progress{w: w, total: total, interval: 2 * time.Second, now: time.Now}
	p.last = p.now()
	if mode == "bar" || (mode == "auto" && terminal) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("operations"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
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
	fmt.Fprintf(p.w, "idemctl: progress %d/%d (%d%%): %d ok, %d failed, %d pending\n",
		c.done(), p.total, pct, c.ok, c.failed, c.pending)
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
