//go:build idemhttp_bug_nolease

package plant

// NoLeaseTake: this build has the bug (see nolease_off.go).
const NoLeaseTake = true
