// Package rabbitmq consumes RabbitMQ queues (through
// github.com/rabbitmq/amqp091-go) into an [inbox.Handler], so that every
// message's effect happens once even though RabbitMQ delivers at least
// once.
//
// It lives in its own module so that idemhttp's core does not depend on
// the AMQP client. Run a [Consumer] on a channel with a handler built by
// [inbox.SQL.Handle] (or any handler that commits the message id with the
// effect):
//
//	handle := in.Handle("order-recorder", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
//		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.ID, m.Body)
//		return err
//	})
//	err := (&rabbitmq.Consumer{Queue: "orders"}).Run(ctx, ch, handle)
//
// # Where the message id comes from
//
// RabbitMQ has no message id of its own: a delivery tag numbers deliveries
// on one channel and changes on every redelivery. The id is the producer's,
// from the AMQP message-id property (the default) or a header
// ([Consumer.IDHeader]). The producer must send the same id when it
// publishes a message again because it is unsure the first publish
// landed (no publisher confirm before a timeout or a lost connection):
// only then can the inbox recognise the producer's second copy, which to
// the broker is a new message. An id drawn afresh per publish dedups the
// broker's redeliveries only.
//
// A delivery with no id is never handled and never acked: it is rejected,
// so the broker dead-letters it if the queue has a dead-letter exchange
// ([NoIDReject], the default), or Run stops with [inbox.ErrNoMessageID]
// ([NoIDStop]).
//
// # Ack after commit, requeue on error
//
// Run acks a delivery only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// ack leaves the delivery unacknowledged, and RabbitMQ requeues every
// unacknowledged delivery of a channel that closes (the process died, the
// connection dropped, the broker closed the channel), with the
// redelivered flag set. A handler error nacks the delivery with requeue,
// or rejects it with [Consumer.RejectOnError]; its transaction rolled back,
// the inbox row with it, so the redelivery runs the effect again. Set
// [Consumer.RetryDelay] so that an outage of the database pauses the
// consumer rather than spinning it through the queue.
//
// # Redelivery to another consumer
//
// RabbitMQ has no partition rebalance; its equivalent is a requeue. The
// deliveries a dead consumer held go back to the queue and the broker
// hands them to any other consumer of the queue at once, possibly while
// the first consumer's transaction is still being committed (a network
// partition, a stalled process whose channel the broker closed). The
// inbox serialises the two: the second transaction's insert of the same
// id waits for the first, then finds its row and runs nothing, or runs the
// effect if the first rolled back. A handler slower than the broker's
// consumer_timeout (30 minutes by default) has its channel closed and its
// delivery requeued the same way.
//
// # Prefetch and channels
//
// [Consumer.Prefetch] sets the channel's QoS: how many unacknowledged
// deliveries the broker sends ahead. Run handles one delivery at a time;
// for parallelism run several Consumers, each on its own channel. On
// cancellation Run requeues the deliveries sent ahead. After a channel or
// connection closes, Run returns [ErrChannelClosed]: open a new channel
// and run again. Leave the client's automatic recovery off, since a
// recovered channel numbers its deliveries afresh and a late ack could
// then acknowledge the wrong message.
package rabbitmq
