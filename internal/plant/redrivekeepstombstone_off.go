//go:build !idemhttp_bug_redrivekeepstombstone

package plant

// RedriveKeepsTombstone, with the idemhttp_bug_redrivekeepstombstone build
// tag: inbox.SQLLedger's Redrive forgets the message's ledger record but
// leaves its tombstone, so that the message an operator redrives is
// dead-lettered again, unrun (internal/msgsim must find it).
const RedriveKeepsTombstone = false
