//go:build !idemhttp_bug_resetnotsent

package plant

// ResetNotSent, with the idemhttp_bug_resetnotsent build tag: an attempt
// that ended in a connection reset counts as provably not sent, even after
// its request was written, so that the call may withdraw its entry and
// report ErrNotSent for a request the server ran.
const ResetNotSent = false
