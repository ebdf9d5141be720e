//go:build idemhttp_bug_prunemillis

package plant

// PruneMillis: this build has the bug (see prunemillis_off.go).
const PruneMillis = true
