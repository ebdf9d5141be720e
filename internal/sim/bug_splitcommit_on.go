//go:build go1.26 && idemhttp_bug_splitcommit

package sim

// bugSplitCommit: the effect commits outside the record's transaction
// (see bug_splitcommit_off.go).
const bugSplitCommit = true
