//go:build !idemhttp_bug_ackfirst

package plant

// AckFirst, with the idemhttp_bug_ackfirst build tag: the inbox reports a message processed before its transaction commits (the commit goes on behind), so that the adapter acks a message whose effect may never commit (internal/msgsim must find it).
const AckFirst = false
