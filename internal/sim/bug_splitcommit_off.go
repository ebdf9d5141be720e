//go:build go1.26 && !idemhttp_bug_splitcommit

package sim

// bugSplitCommit is a planted bug: with the idemhttp_bug_splitcommit
// build tag, the transactional world's handler commits its charge when it
// writes it (a statement outside the request's transaction), apart from
// the transaction that stores the response, as
// a server whose idempotency record and business write are two commits
// does. A crash between the two then leaves the effect without the
// record, and the retry runs it again. The simulator must find it.
const bugSplitCommit = false
