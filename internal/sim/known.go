//go:build go1.26

package sim

import (
	"net/http"
	"slices"
	"time"
)

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

	// bugCacheOnly: a batch whose sync failed (EIO) and whose
	// truncation failed too stays in the page cache, not on disk; the
	// next run of the process, on the same machine, reads it as valid
	// and appends after it; a power cut then leaves a hole before
	// acknowledged batches, and the journal no longer opens
	// (ErrCorrupt): the fsync-gate problem, one fault deeper than the
	// log's truncation handles (TestKnownBugCacheOnly).
	bugCacheOnly = "a batch left only in the cache by a failed sync and truncation is built on, and a power cut corrupts the journal"
)

// The client's defects of issue 31 that the widened world (issue 32)
// meets: being fixed on their own branch; each is recognised by evidence
// the world records (a test per bug replays its seed: known_test.go).
const (
	// bugRedirectDone (issue 31 §1.4): a 3xx the caller's own
	// CheckRedirect left unfollowed (http.ErrUseLastResponse) is
	// recorded done, though nothing ran at its target: a rerun of the
	// operation then sends nothing, and the operation never runs.
	bugRedirectDone = "a 3xx the caller's CheckRedirect left unfollowed is recorded done"

	// bugUnobservable (issue 31 §1.8): a protocol registered with
	// Transport.RegisterProtocol shows the client none of net/http's
	// httptrace events, and an attempt that failed after sending (its
	// response lost, its timeout) is taken for "not sent": the entry is
	// withdrawn, the call reports ErrNotSent, and the rerun runs the
	// operation again.
	bugUnobservable = "an attempt through a registered protocol (no httptrace events) is taken for not sent"

	// bugFencedNotSent (issue 31 §1.3): in a fleet, a call that sent
	// nothing withdraws its entry, the journal refuses (another worker
	// began or claimed it, and may have sent it: ErrFenced), and the
	// call still reports ErrNotSent: the job's rerun under a new key
	// runs the operation a second time.
	bugFencedNotSent = "a withdrawal refused by fencing is reported not sent"

	// bugClientSlots (issue 31 §1.1): two Clients sharing one journal
	// (the only way one process can share a file journal) keep a
	// sender's slot each: one withdraws (deletes) the entry the other is
	// sending under, and the rerun runs the operation again; or one's
	// first attempt under a key it minted meets the other's request in
	// progress (409), takes it for the application's own 409 (a fresh
	// key cannot be in use, it reasons) and records it done.
	bugClientSlots = "two Clients sharing a journal each keep their own sender's slots"

	// bugFresh409 (found by the widened world; issue 31 §1.1 is its
	// cousin): a call's first attempt under a key the call minted gets a
	// 409 "in progress", and the client takes it for the application's
	// own 409 (a key minted for this call cannot be in use yet, it
	// reasons), returns it as the answer and records the operation done.
	// But the journal hands the operation's entry, and so the key, to
	// any other sender that begins the operation: a second Client on the
	// same journal, or, in a fleet, another worker whose Begin takes the
	// entry's lease. That sender's request is the one in progress.
	bugFresh409 = "a 409 under a key minted for the call is taken for the application's, though another sender shares the key"

	// bugPanicSlot (issue 31 §1.5): a callback that panics before the
	// call's cleanup is set up (Hooks.OnJournal as the call opens: its
	// Begin, or judge marking an entry past the retention abandoned)
	// leaves the operation's slots held: every later call of the
	// operation in the process waits for ever.
	bugPanicSlot = "a journal hook that panics as a call opens leaves the operation's slot held"
)

// KnownBugs lists them, for the test's summary.
var KnownBugs = []string{bugClockBack, bugCacheOnly, bugRedirectDone, bugUnobservable, bugFencedNotSent, bugClientSlots, bugFresh409, bugPanicSlot}

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
	return w.notSentRan(op)
}

// notSentRan is the known bug that explains a call of op reported not
// sent whose key has an effect, "" if none does.
func (w *world) notSentRan(op int) string {
	// Every call's evidence, returned or not (a call whose process died
	// in a callback that blocks never returns); the class of those that
	// returned.
	w.mu.Lock()
	calls := slices.Clone(w.calls)
	notSent := map[*call]bool{}
	for _, c := range calls {
		notSent[c] = c.done && c.class == outNotSent
	}
	w.mu.Unlock()
	ran := func(keys []string) bool {
		for _, k := range keys {
			if k != "" && len(w.ledger.byKey(k)) > 0 {
				return true
			}
		}
		return false
	}
	for _, c := range calls {
		if c.op != op {
			continue
		}
		c.mu.Lock()
		keys, fenced, withdrew, tried := append([]string{c.key}, c.keys...), c.fenced, slices.Clone(c.withdrew), c.tries > 0
		c.mu.Unlock()
		switch {
		case w.cfg.Transport == transportProtocol && tried && (ran(withdrew) || notSent[c] && ran(keys)):
			// An entry withdrawn though sent: the attempt's failure
			// was taken for "not sent" (reported so, or, under a key
			// of the caller's, only acted on).
			return bugUnobservable
		case notSent[c] && ran(keys) && fenced && w.fleet != nil:
			return bugFencedNotSent
		case w.cfg.Clients > 1 && ran(withdrew):
			return bugClientSlots
		}
	}
	return ""
}

// doneKnown is the known bug that explains a done entry, status status,
// of op without its effect, "" if none does.
func (w *world) doneKnown(op, status int) string {
	switch {
	case status/100 == 3 && w.cfg.CheckRedirect == redirectLast:
		return bugRedirectDone
	case status == http.StatusConflict && (w.cfg.Clients > 1 || w.fleet != nil):
		return bugFresh409
	}
	return ""
}

// statusKnown is the known bug that explains a call of op answered with
// status, which the job's requests cannot cause, "" if none does.
func (w *world) statusKnown(op, status int) string { return w.doneKnown(op, status) }

// notSentKnown is the known bug that explains call c reported not sent
// though its key has an effect, "" if none does.
func (w *world) notSentKnown(c *call) string { return w.notSentRan(c.op) }

// lostKnown is the known bug that explains op unresolved after the
// recovery, "" if none does.
func (w *world) lostKnown(op int) string { return w.onceKnown(op) }

// stuckKnown is the known bug that explains a recovery that made no
// progress, or a goroutine that never ended, "" if none does.
func (w *world) stuckKnown() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.panickedOpening {
		return bugPanicSlot
	}
	return ""
}

// cacheKnown is the known bug that explains a journal that does not
// open, verify or keep an acknowledged Begin: bugCacheOnly if a
// truncation failed in the world.
func (w *world) cacheKnown() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cacheOnly {
		return bugCacheOnly
	}
	return ""
}
