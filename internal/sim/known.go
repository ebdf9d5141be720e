//go:build go1.26

package sim

import "time"

// Bugs of the client that the simulator found and that are not fixed
// yet. A failure one of them explains is reported as known (TestSim
// counts it and passes); each has a test that replays its seed, skipped
// until the fix, which then must make it pass (remove the bug from here
// then, and unskip the test).
const (
	// bugClockBack: the client's clock set back, and then, before the
	// journal sees it below its high-water mark, moved on past the
	// mark (a day of downtime): every entry then looks younger than it
	// is by the jump, and Resume resends an entry older than the
	// server's retention under a key the server has forgotten
	// (TestKnownBugClockBack).
	bugClockBack = "a clock set back and then past the high-water mark makes entries look younger than the retention"
)

// KnownBugs lists them, for the test's summary.
var KnownBugs = []string{bugClockBack}

// onceKnown is the known bug that explains an operation with more than
// one effect, "" if none does.
func (w *world) onceKnown(op int) string {
	es := w.ledger.of(op)
	w.mu.Lock()
	back := w.clockBack
	w.mu.Unlock()
	for i := 1; i < len(es); i++ {
		if es[i].key == es[0].key && es[i].at.Sub(es[0].at) > 24*time.Hour && back {
			return bugClockBack
		}
	}
	return ""
}

// cacheKnown is the known bug that explains a journal that does not
// open, verify or keep an acknowledged Begin, "" if none does. None
// does since the log settles a file left unclosed before it appends to
// it (bugCacheOnly, fixed: TestKnownBugCacheOnly).
func (w *world) cacheKnown() string { return "" }
