//go:build !idemhttp_bug_giveupdone

package plant

// GiveUpDone, with the idemhttp_bug_giveupdone build tag: a call that gave up with its retries exhausted records its operation done, as if a definite answer had come.
const GiveUpDone = false
