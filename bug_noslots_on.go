//go:build idemhttp_bug_noslots

package idemhttp

// bugNoSenderSlots: this build takes no sender's slot (see
// bug_noslots_off.go). It exists only so the simulator can show it finds
// the bug; never ship it.
const bugNoSenderSlots = true
