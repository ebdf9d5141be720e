//go:build go1.26

package sim

import "net/http"

// Bugs of the client that the simulator found and that are not fixed
// yet. A failure one of them explains is reported as known (TestSim
// counts it and passes); each has a test that replays its seed, skipped
// until the fix, which then must make it pass (remove the bug from here
// then, and unskip the test).
//
// One is open: the server core's bugOwnRow409. The fleet journal's
// bugFleetClock and bugFleetExpiredRerun are fixed (TestFoundFleetClock,
// TestFoundFleetExpiredRerun). Every bug of the
// client it found is fixed (their tests run unskipped: TestKnownBugClockBack,
// TestKnownBugCacheOnly, the TestFound ones). A bug found next goes here
// as a constant, with its test, until its fix.

// bugOwnRow409 (issue 32's server, found at seed 9714): a transactional
// request whose handler committed its transaction itself (COMMIT AND
// CHAIN, say) and whose store of the response was then refused by the
// database (a PostgreSQL error: CommitRefused) is answered 409, "in
// progress", as a duplicate would be: the fresh look at the key after the
// rollback (Request.Rechecked) finds the request's own claim row, which
// the handler's COMMIT committed, and cannot tell it from another
// request's, for a row carries no token to the core (servercore.Row).
// The key is then held, fail-closed, for the TTL (409 to every retry, no
// second run); but the first answer is wrong: it should be the ended
// transaction's 500, and the key kept not replayable (410). A client that
// minted the key for the call takes a 409 on its first attempt for the
// application's own (no other request can hold a key minted for it) and
// returns it. contrib/postgres's TxMiddleware takes the same steps
// (txrun.go's commit, then recheck). The fix wants the shells to pass
// whether the row found is the request's own (its token), which the core
// would take for the handler's own commit (Marking): a change to the
// core's Row and to both transactional shells' lookups.
const bugOwnRow409 = "a refused store after the handler's own COMMIT answers 409 (issue 32, server)"

// KnownBugs lists them, for the test's summary.
var KnownBugs = []string{bugOwnRow409}

// onceKnown is the known bug that explains an operation with more than
// one effect, "" if none does. None does since the journal measures a
// clock set back, or keeps that it cannot (bugClockBack, fixed:
// TestKnownBugClockBack), and the fleet journal keeps a set-back as its
// doubt and never lets a withdrawal remove an abandoned entry
// (bugFleetClock and bugFleetExpiredRerun, fixed: TestFoundFleetClock,
// TestFoundFleetExpiredRerun).
func (w *world) onceKnown(int) string { return "" }

// cacheKnown is the known bug that explains a journal that does not
// open, verify or keep an acknowledged Begin, "" if none does. None
// does since the log settles a file left unclosed before it appends to
// it (bugCacheOnly, fixed: TestKnownBugCacheOnly).
func (w *world) cacheKnown() string { return "" }

// The seven bugs of the client that the widened world of issue 32 met
// (a 3xx left unfollowed recorded done, an unobservable transport's
// attempt taken for not sent, a fenced withdrawal reported not sent, two
// Clients' own sender's slots, a fresh key's 409 taken for the
// application's, a hook's panic leaving a slot held) were fixed by the
// lifecycle work of issue 31 before the world reached main: their seeds
// run clean (known_test.go, TestFoundRedirectDone and the six after it).
func (w *world) notSentKnown(*call) string { return "" }
func (w *world) doneKnown(int, int) string { return "" }

// statusKnown is the known bug that explains a call of op answered
// status, which the job cannot have caused, "" if none does.
func (w *world) statusKnown(op, status int) string {
	if status != http.StatusConflict {
		return ""
	}
	if w.cfg.Shell != shellTx {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := range w.selfCommitted {
		if w.opOfStoreKey(k) == op {
			return bugOwnRow409
		}
	}
	return ""
}

func (w *world) lostKnown(int) string { return "" }
func (w *world) stuckKnown() string   { return "" }
