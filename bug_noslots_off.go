//go:build !idemhttp_bug_noslots

package idemhttp

// bugNoSenderSlots is a planted bug for the simulator (internal/sim) to
// find: with the idemhttp_bug_noslots build tag, calls take no sender's
// slot, so that two calls of one operation send at once, and one may
// withdraw (delete) the journal entry the other sends under. Never ship
// that build.
const bugNoSenderSlots = false
