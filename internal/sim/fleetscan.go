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
