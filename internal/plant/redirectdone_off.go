//go:build !idemhttp_bug_redirectdone

package plant

// RedirectDone, with the idemhttp_bug_redirectdone build tag: a 3xx the client's own rules left unfollowed (a redirect to another origin, with a key) is recorded done, as if the operation ran at its target.
const RedirectDone = false
