//go:build idemhttp_bug_unfinal

package plant

// Unfinal: this build has the bug (see unfinal_off.go).
const Unfinal = true
