//go:build !idemhttp_bug_heldreject

package plant

// HeldReject, with the idemhttp_bug_heldreject build tag: the consumer
// simulator's model of contrib/rabbitmq (internal/msgsim), which holds a
// failed delivery unacknowledged for its retry delay, settles it at its due
// time with a nack without requeue (the requeue flag flipped), which the
// broker takes for a dead letter: the message is dead-lettered after one
// failed run (internal/msgsim must find it).
const HeldReject = false
