//go:build !idemhttp_bug_splitdedup

package plant

// SplitDedup, with the idemhttp_bug_splitdedup build tag: the inbox records a message's id in a transaction of its own, committed before the effect's transaction begins, so that an effect that fails or dies leaves the id recorded and the redelivery skips it (internal/msgsim must find it).
const SplitDedup = false
