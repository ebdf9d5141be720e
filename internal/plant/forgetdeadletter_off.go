//go:build !idemhttp_bug_forgetdeadletter

package plant

// ForgetDeadLetter, with the idemhttp_bug_forgetdeadletter build tag: the
// message core (inbox.Delivery.DeadLettered) forgets a message's ledger
// record whatever the shell said of its dead letter, so that a dead letter
// that failed (or whose answer was lost) leaves a message that comes back
// and runs again from a count of zero (internal/msgsim must find it).
const ForgetDeadLetter = false
