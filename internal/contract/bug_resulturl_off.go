//go:build !idemhttp_bug_resulturl

package contract

// bugResultURL is a planted bug for the simulator (internal/sim,
// docs/simulation.md): with the idemhttp_bug_resulturl build tag, a kept
// result's URL-valued headers (Location, Content-Location, Link...) are
// kept as the server wrote them (issue 31 §1.7): a signed URL's
// signature reaches the journal. Never ship a build with it.
const bugResultURL = false
