//go:build !idemhttp_bug_completeonce

package plant

// CompleteOnce, with the idemhttp_bug_completeonce build tag: the server
// core (internal/servercore) tries a Streamed Complete once, with no pin
// and no retry while the claim's lock is live: a store that refuses one
// Complete leaves the claim to its lock, which runs out, and a retry runs
// the handler again, though it ran.
const CompleteOnce = false
