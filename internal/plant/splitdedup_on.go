//go:build idemhttp_bug_splitdedup

package plant

// SplitDedup: this build has the bug (see splitdedup_off.go).
const SplitDedup = true
