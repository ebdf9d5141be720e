//go:build !idemhttp_bug_resultencoding

package contract

// bugResultEncoding is a planted bug for the simulator (internal/sim,
// docs/simulation.md): with the idemhttp_bug_resultencoding build tag, a
// kept result loses its Content-Encoding (issue 31 §1.6): a body the
// caller read encoded (it asked for the encoding itself) replays as bytes
// nobody can read as what they are. Never ship a build with it.
const bugResultEncoding = false
