//go:build idemhttp_bug_noslots

package plant

// NoSenderSlots: this build has the bug (see noslots_off.go).
const NoSenderSlots = true
