//go:build idemhttp_bug_resetnotsent

package plant

// ResetNotSent: this build has the bug (see resetnotsent_off.go).
const ResetNotSent = true
