//go:build idemhttp_bug_nobeat

package plant

// NoBeat: this build has the bug (see nobeat_off.go).
const NoBeat = true
