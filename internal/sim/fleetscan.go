//go:build go1.26

package sim

// A fleet whose workers also run Resume without Entries (issue 32 §1.2,
// Config.FleetScan): a worker's process that resends every pending entry
// of the shared journal, as a job written for one machine does, rather
// than what its worker claimed: Resume claims them itself (ClaimPending),
// so it resends only entries no live worker holds, each under its own
// lease, and sends each under its key: the server runs it once. Resume leaves the shared
// journal's pruning to the journal (it prunes by itself, Retain): a
// worker's clock, which may run a day ahead, never prunes what the other
// workers rely on.

// scans reports whether Resume call c, in a fleet, resends the whole
// journal.
func (w *world) scans(c *call) bool {
	return w.fleet != nil && w.draw(100, "fleetscan", c.id) < w.cfg.FleetScan
}

// Found by this dimension at seed 4158, and fixed: Resume without Entries
// on a journal a fleet shares listed its pending entries (Pending), those
// other live workers held and sent included, and resent each without its
// lease; the holder's withdrawal (a call that sent nothing: a panic in
// its Pacer) removed the entry while the resend ran its request, and a
// later run of the batch began the operation anew under a new key: two
// effects. Resume now claims (ClaimPending) what it resends on such a
// journal: TestFoundFleetScanUnleased.
