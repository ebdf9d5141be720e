//go:build !idemhttp_bug_resumeprunes

package plant

// ResumePrunes, with the idemhttp_bug_resumeprunes build tag: Resume
// without Entries prunes the journal's done entries older than the
// retention by the caller's clock, even a journal that prunes by itself
// (Retain), as it did before the fix of 969779f: a machine whose clock
// runs ahead prunes done entries that the journal, and the other workers
// of a fleet sharing it, still rely on, and a rerun of their operations
// runs them again.
const ResumePrunes = false
