//go:build !idemhttp_bug_opensettle

package wal

// bugOpenSettle is a planted bug for the simulator (internal/sim,
// docs/simulation.md): with the idemhttp_bug_opensettle build tag, an
// open whose settling of the last batch fails (its write, its sync or
// its directory's sync: see settle) goes on all the same, and the log
// appends after a batch that may be in the page cache only: a power cut
// then leaves a hole before acknowledged batches. The journal's open
// under faults (Config.OpenFaults) must find it. Never ship a build with
// it.
const bugOpenSettle = false
