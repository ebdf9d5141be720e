//go:build idemhttp_bug_heldreject

package plant

// HeldReject: this build has the bug (see heldreject_off.go).
const HeldReject = true
