//go:build go1.26

package sim

// A fleet whose workers also run Resume without Entries (issue 32 §1.2,
// Config.FleetScan): a worker's process that resends every pending entry
// of the shared journal (Pending), as a job written for one machine does,
// rather than what its worker claimed (ClaimPending). Each resend begins
// its entry, which takes the entry's lease from whoever held it (a live
// worker sending it now, whose later writes are then fenced), and sends
// it under its key: the server runs it once. Resume leaves the shared
// journal's pruning to the journal (it prunes by itself, Retain): a
// worker's clock, which may run a day ahead, never prunes what the other
// workers rely on.

// scans reports whether Resume call c, in a fleet, resends the whole
// journal.
func (w *world) scans(c *call) bool {
	return w.fleet != nil && w.draw(100, "fleetscan", c.id) < w.cfg.FleetScan
}

// bugFleetScanUnleased (found by this dimension, at seed 4158): Resume
// without Entries on a journal a fleet shares lists its pending entries
// (Pending), those other live workers hold and send included, and
// resends each after a reread (Get), without taking its lease. The
// worker that holds the entry still may withdraw it (a call that sent
// nothing: a panic in its Pacer, say, deletes its entry), and the
// journal lets it: the entry is gone while the resend runs its request.
// A later run of the batch finds no entry for the operation, begins it
// anew under a new key, and it runs twice. A worker's Resume with
// Entries (claimed with ClaimPending) holds their leases and is safe.
// The fix is the client's: Resume without Entries on a shared journal
// claims (ClaimPending) rather than lists, or a resend takes its entry's
// lease (a Begin) as a Do of the operation does, so that the holder's
// withdrawal is fenced. Classified by its evidence: a fleet whose Resumes
// scan the journal, and a key of the operation withdrawn by a call and
// resent by a scanning Resume.
const bugFleetScanUnleased = "a fleet's Resume without Entries resends entries without their leases, and their holders withdraw them (issue 32)"

func init() { KnownBugs = append(KnownBugs, bugFleetScanUnleased) }

// fleetScanKnown is bugFleetScanUnleased if it can explain a failure of
// op: a key of op that a call withdrew (or tried to) and that a Resume
// of the whole shared journal resent.
func (w *world) fleetScanKnown(op int) string {
	if w.fleet == nil || w.cfg.FleetScan == 0 {
		return ""
	}
	withdrawn := map[string]bool{}
	calls := w.returnedCalls()
	for _, c := range calls {
		c.mu.Lock()
		for _, k := range c.withdrew {
			withdrawn[k] = true
		}
		c.mu.Unlock()
	}
	for _, c := range calls {
		if !c.resume || !w.scans(c) {
			continue
		}
		c.mu.Lock()
		keys := c.keys
		c.mu.Unlock()
		for _, k := range keys {
			if withdrawn[k] && (op < 0 || w.opOfKey(k) == op) {
				return bugFleetScanUnleased
			}
		}
	}
	return ""
}
