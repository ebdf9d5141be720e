//go:build idemhttp_bug_hijackstored

package plant

// HijackStored: this build has the bug (see hijackstored_off.go).
const HijackStored = true
