//go:build !idemhttp_bug_panicslot

package plant

// PanicSlot, with the idemhttp_bug_panicslot build tag: a call that a callback's panic ends is not settled: its slots stay held and its entry is left as it is.
const PanicSlot = false
