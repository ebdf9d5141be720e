//go:build idemhttp_bug_aftercommit

package plant

// AfterCommit: this build has the bug (see aftercommit_off.go).
const AfterCommit = true
