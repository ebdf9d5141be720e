//go:build go1.26

package sim

// Bugs of the client that the simulator found and that are not fixed
// yet. A failure one of them explains is reported as known (TestSim
// counts it and passes); each has a test that replays its seed, skipped
// until the fix, which then must make it pass (remove the bug from here
// then, and unskip the test).
//
// Three are open: the fleet journal's bugFleetClock and
// bugFleetExpiredRerun, and the client's bugFleetScanUnleased (in
// fleetscan.go, with the dimension that found it). Every other bug of the
// client it found is fixed (their tests run unskipped:
// TestKnownBugClockBack, TestKnownBugCacheOnly, the TestFound ones), and
// so is the server core's bugOwnRow409 (a refused store after the
// handler's own COMMIT answered 409: TestFoundOwnRow409). A bug found
// next goes here as a constant, with its test, until its fix.

// bugFleetClock (the fleet's, issue 32's first phase; met on main before
// the server's world too, at seeds 17520, 35758, 39186 and 49334 of its
// first 50,000): the fleet database's clock jumping (a failover to a host
// whose clock is off) makes the fleet journal misjudge its entries' and
// leases' ages, for good. Set back, then a day's downtime: a pending entry
// older than the server's retention looks younger, and a worker's Resume
// resends it under a key the server has forgotten, which runs it again
// (invariant 1); a lease taken before the jump holds its entry for as
// long as the jump, past the recovery (invariant 4). Set forward by more
// than a day: an entry whose request ran is abandoned as past the
// retention (ErrKeyExpired) and then gone, and a rerun of its operation
// mints a new key and runs it again (seed 24093). The file journal's
// clock measures a jump against the uptime clock (filejournal/clock.go:
// TestKnownBugClockBack); the fleet's has no such evidence
// (journaltest.FleetModel, and contrib/postgres's Journal on now()). About
// one seed in 15,000.
const bugFleetClock = "the fleet database's clock jumped: entries and leases misjudged (issue 32, first phase)"

// bugFleetExpiredRerun (the fleet's, met once in the first million seeds,
// at 626964): in a fleet, an operation whose request ran is left pending
// (its answer lost), a day passes, and its entry is reported past the
// retention (ErrKeyExpired), as it must be; but a later run of the batch
// begins the operation anew under a new key, and it runs twice. A file
// journal keeps the entry abandoned and the operation's key with it; the
// fleet's (journaltest.FleetModel) lets a Begin of the operation start
// afresh. Classified by its evidence: a fleet, and a day gone by.
const bugFleetExpiredRerun = "a fleet's operation past the retention begun again under a new key (issue 32, first phase)"

// KnownBugs lists them, for the test's summary.
var KnownBugs = []string{bugFleetClock, bugFleetExpiredRerun}

// fleetClockKnown is bugFleetClock if it can explain a failure of this
// world: a fleet whose database's clock jumped.
func (w *world) fleetClockKnown() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fleet != nil && w.dbJumped {
		return bugFleetClock
	}
	if w.fleet != nil && w.stats["a day passes"] > 0 {
		return bugFleetExpiredRerun
	}
	return ""
}

// onceKnown is the known bug that explains an operation with more than
// one effect, "" if none does. None does since the journal measures a
// clock set back, or keeps that it cannot (bugClockBack, fixed:
// TestKnownBugClockBack).
func (w *world) onceKnown(op int) string {
	if k := w.fleetScanKnown(op); k != "" {
		return k
	}
	return w.fleetClockKnown()
}

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
// status, which the job cannot have caused, "" if none does. None does
// since the core tells a request's own claim row from another's after a
// rollback (bugOwnRow409, fixed: TestFoundOwnRow409).
func (w *world) statusKnown(op, status int) string { return "" }

func (w *world) lostKnown(int) string { return w.fleetClockKnown() }
func (w *world) stuckKnown() string   { return "" }
