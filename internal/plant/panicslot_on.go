//go:build idemhttp_bug_panicslot

package plant

// PanicSlot: this build has the bug (see panicslot_off.go).
const PanicSlot = true
