//go:build !idemhttp_bug_unfinal

package plant

// Unfinal, with the idemhttp_bug_unfinal build tag: a fleet journal lets a stale worker's outcome replace a final one: a done entry goes back to pending.
const Unfinal = false
