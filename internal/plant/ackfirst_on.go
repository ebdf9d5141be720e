//go:build idemhttp_bug_ackfirst

package plant

// AckFirst: this build has the bug (see ackfirst_off.go).
const AckFirst = true
