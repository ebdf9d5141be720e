//go:build go1.26

package sim

import "time"

// Bugs of the client that the simulator found and that are not fixed
// yet. A failure one of them explains is reported as known (TestSim
// counts it and passes); each has a test that replays its seed, skipped
// until the fix, which then must make it pass (remove the bug from here
// then, and unskip the test).
const (
	// bugPrunedDone: a done entry is pruned once it is older than the
	// retention by the client's clock (Resume prunes first; so does the
	// journal's own pruner), and a rerun of its operation then finds no
	// entry and runs it again under a new key. The README says done is
	// done "within the retention or past it". A clock set forward makes
	// it worse: the server still holds the old key, but the client
	// forgot it (TestKnownBugPrunedDone*).
	bugPrunedDone = "a pruned done entry lets a rerun run its operation again"

	// bugWithdrawFailed: a call that sent nothing withdraws its entry;
	// when the journal fails that write (and the fallback, marking it
	// abandoned, fails too: the journal stops writing after a failure),
	// the entry stays pending, and yet the call reports ErrNotSent, "safe
	// to retry under a new key". Resume later sends the entry under its
	// key: a retry under a new key would run the operation twice
	// (TestKnownBugWithdrawFailed).
	bugWithdrawFailed = "a failed withdrawal leaves a pending entry behind an ErrNotSent"

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

	// bugBeginReappears: a Begin the journal failed is reported as
	// ErrNotSent ("nothing sent, no entry left: safe to retry under a
	// new key"), but the log documents that such a Begin may reappear
	// after the reopen (its write reached the page cache and its
	// truncation failed), pending: Resume then sends it under its key,
	// and a retry under a new key runs the operation twice
	// (TestKnownBugBeginReappears).
	bugBeginReappears = "a Begin the journal failed, reported ErrNotSent, reappears pending and is resent"
)

// bugFreedEarly: a compaction renames its new file over the journal,
// then fails to sync the directory (EIO); the rename may not survive a
// power cut, and yet the log frees the old file at once
// (File.CloseReplaced truncates it). A power cut that keeps the
// truncation but not the rename leaves an empty journal: acknowledged
// Begins are gone. Closing the old file without freeing it when the
// directory sync failed fixes it (TestKnownBugFreedBeforeTheRenameIsDurable).
const bugFreedEarly = "a compaction whose directory sync failed frees the old file, which a power cut may bring back truncated"

// KnownBugs lists them, for the test's summary.
var KnownBugs = []string{bugPrunedDone, bugWithdrawFailed, bugClockBack, bugCacheOnly, bugBeginReappears, bugFreedEarly}

// onceKnown is the known bug that explains an operation with more than
// one effect, "" if none does.
func (w *world) onceKnown(op int) string {
	if k := w.prunedKnown(op); k != "" {
		return k
	}
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

// forgot records that a Prune dropped op's done entry.
func (w *world) forgot(op int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pruned == nil {
		w.pruned = map[int]bool{}
	}
	w.pruned[op] = true
}

// prunedKnown is bugPrunedDone if a Prune dropped op's done entry.
func (w *world) prunedKnown(op int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pruned[op] {
		return bugPrunedDone
	}
	return ""
}

// cacheKnown is the known bug that explains a journal that does not
// open, verify or keep an acknowledged Begin: bugCacheOnly if a
// truncation failed in the world, bugFreedEarly if a directory sync did.
func (w *world) cacheKnown() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.cacheOnly:
		return bugCacheOnly
	case w.dirSyncFailed:
		return bugFreedEarly
	}
	return ""
}
