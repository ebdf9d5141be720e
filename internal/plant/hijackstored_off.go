//go:build !idemhttp_bug_hijackstored

package plant

// HijackStored, with the idemhttp_bug_hijackstored build tag:
// idemserver.Middleware's recorder does not note that its handler
// hijacked the connection; the core takes the run for one that wrote
// nothing and keeps an empty 200 for replay, which a retry gets instead
// of the answer the handler sent on the connection.
const HijackStored = false
