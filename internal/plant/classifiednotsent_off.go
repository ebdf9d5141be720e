//go:build !idemhttp_bug_classifiednotsent

package plant

// ClassifiedNotSent, with the idemhttp_bug_classifiednotsent build tag:
// an attempt that failed and that the caller's Policy.Classify asked to
// retry counts as provably not sent, even after its request was written:
// the classifier's verdict taken for wire evidence. A call whose attempts
// all so failed then withdraws its entry and reports ErrNotSent for a
// request the server may have run.
const ClassifiedNotSent = false
