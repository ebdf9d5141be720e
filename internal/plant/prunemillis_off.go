//go:build !idemhttp_bug_prunemillis

package plant

// PruneMillis, with the idemhttp_bug_prunemillis build tag: inbox.SQL's
// Prune passes its age to the database in milliseconds where the column
// holds microseconds, so that it deletes ids a thousand times younger
// than asked: ids the broker may still redeliver, whose effect then runs
// again (internal/msgsim must find it).
const PruneMillis = false
