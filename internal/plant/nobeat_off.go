//go:build !idemhttp_bug_nobeat

package plant

// NoBeat, with the idemhttp_bug_nobeat build tag: inbox.Runner never
// calls its Hooks.Beat (a NATS AckProgress, an SQS visibility extension)
// while a handler runs, so that a slow handler's delivery goes to another
// consumer at the end of its ack wait (internal/msgsim must find it).
const NoBeat = false
