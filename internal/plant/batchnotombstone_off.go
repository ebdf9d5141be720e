//go:build !idemhttp_bug_batchnotombstone

package plant

// BatchNoTombstone, with the idemhttp_bug_batchnotombstone build tag:
// inbox.SQL.ProcessBatch of several ids skips its tombstone check, so
// that a dead-lettered message that comes back (its dead letter failed,
// or a producer's duplicate of it) is answered Duplicate and acked:
// neither processed nor dead-lettered (internal/msgsim must find it).
const BatchNoTombstone = false
