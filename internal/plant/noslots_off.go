//go:build !idemhttp_bug_noslots

package plant

// NoSenderSlots, with the idemhttp_bug_noslots build tag: calls take no
// sender's slot, so that two calls of one operation send at once and one
// may withdraw (delete) the journal entry the other sends under.
const NoSenderSlots = false
