//go:build idemhttp_bug_countshutdowns

package plant

// CountShutdowns: this build has the bug (see countshutdowns_off.go).
const CountShutdowns = true
