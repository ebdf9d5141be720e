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
// so the broker dead-letters it if the queue has a dead-letter exchange,
// and reported through [Consumer.OnDeadLetter] and a log line
// ([NoIDReject], the default), or Run stops with an error naming the
// queue and wrapping [inbox.ErrNoMessageID] ([NoIDStop]).
//
// # Id spaces
//
// Each delivery's [inbox.Message.IDSpace] is its queue (or
// [Consumer.IDSpace]), so an inbox shared by the consumers of two queues
// never takes one queue's message for a duplicate of the other's.
//
// # Ack after commit
//
// Run acks a delivery only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// ack leaves the delivery unacknowledged, and RabbitMQ requeues every
// unacknowledged delivery of a channel that closes (the process died, the
// connection dropped, the broker closed the channel), with the
// redelivered flag set.
//
// # The message core and its ledger
//
// Every delivery goes through the message core of the inbox package
// ([inbox.Runner], see docs/consumer.md): it decides ack, requeue (at once
// or after a delay) and dead-letter from evidence and from the inbox's own
// record of the message's handler runs, [Consumer.Ledger]; Run maps each
// decision onto the channel's verbs (ack, nack with requeue, reject) and
// keeps no rule of its own. Give it the ledger of the handler's inbox:
//
//	c := &rabbitmq.Consumer{Queue: "orders", Ledger: in.Ledger("order-recorder")}
//
// Run never decides from a quorum queue's x-delivery-count, which also
// counts the returns of shutdowns, of deliveries sent ahead and handed
// back, and of a neighbour's processing limit.
//
// # Shutdown
//
// Cancelling Run's context loses nothing and counts nothing, whatever the
// settings: a delivery whose handler is running is acknowledged if the
// handler returns nil (its effect committed) and requeued otherwise; the
// deliveries sent ahead, and those waiting out a retry delay, are
// requeued; none is rejected, dead-lettered, or counted as a failure in
// the ledger, however many shutdowns a message meets. Run cancels its
// subscription before it requeues, so that the broker hands them to other
// consumers. A quorum queue counts each such return (x-delivery-count),
// and its own delivery-limit (RabbitMQ 4 sets 20 by default) dead-letters
// or drops a message that met that many: set it to -1 (a policy's
// delivery-limit), or far above Retry.MaxDeliveries plus the restarts a
// message may meet.
//
// # Poison messages
//
// A handler error rolls its transaction back, the inbox row with it; the
// ledger counts the failure, and the delivery comes back after a delay
// that doubles with each counted failure ([Consumer.Retry]: 1 s to 5 min
// by default). RabbitMQ has no delayed requeue, so Run holds the failed
// delivery unacknowledged for the delay and then requeues it, and other
// deliveries go on meanwhile: a held delivery takes no prefetch slot (see
// Held deliveries and the prefetch below), so the messages behind a
// poison message run while it waits, whatever the prefetch, on classic
// queues (which requeue it at their head) as on quorum queues. On its
// [inbox.Retry.MaxDeliveries]-th
// failed run (5 by default) it is rejected without requeue: RabbitMQ
// dead-letters it to the queue's dead-letter exchange, and Run reports it
// through [Consumer.OnDeadLetter] and a log line at level Error. Declare
// the queue with a dead-letter exchange (x-dead-letter-exchange, or a
// policy): without one, RabbitMQ discards rejected messages, and the log
// line is all that is left.
//
// A message that kills its consumer's process while its handler runs is
// counted too: before the handler of a redelivered message runs, the
// ledger records the run, and a run that never ends is a failed one. Once
// they reach the limit, the message is dead-lettered on arrival, without
// running again. Its first delivery is not so marked (it would cost a
// write per message), so it gets one run more than the limit.
//
// # A hung handler
//
// A handler runs for at most [Consumer.ProcessingLimit] (5 minutes by
// default). Then its context ends, which rolls an inbox transaction back
// (see [inbox.SQL]: the server's own timeouts end it even if the handler
// ignores its context), the ledger counts a failure, and Run cancels its
// subscription and requeues the delivery and those sent ahead, so that
// other consumers get them at once: a healthy delivery sent ahead is
// never held, nor counted, for its hung neighbour. Run waits for the
// handler to return, acknowledges nothing it requeued, subscribes again
// and goes on. Without a limit (a negative ProcessingLimit), RabbitMQ's
// consumer_timeout (30 minutes by default) closes a channel whose
// delivery stays unacknowledged.
//
// # Across an upgrade
//
// The inbox's rows written by the previous release stay duplicates, and
// an instance of the previous release running beside this one during a
// rolling deploy agrees with it on every message id (see Formats and
// upgrades in the inbox package). What the previous release counted in a
// Run's memory, or read from x-delivery-count, is not carried over: a
// poison message's count starts again in the ledger.
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
// effect if the first rolled back. A handler past its processing limit
// has its delivery requeued the same way (see above).
//
// # Inbox retention
//
// RabbitMQ sets no bound on how late a message comes back: a delivery
// requeued after its effect committed (its ack lost) waits in the queue
// until a consumer takes it, for as long as the queue goes unconsumed.
// Keep the inbox's ids ([inbox.SQL.Prune], at least
// [inbox.SQL.MinRetention]) longer than that, and longer than producers
// may republish.
//
// # Held deliveries and the prefetch
//
// RabbitMQ counts an unacknowledged delivery against the prefetch of the
// subscription (the consumer) it came from, and a prefetch set on a
// channel applies only to the consumers subscribed after it (quorum
// queues refuse the channel-wide kind). So when Run holds a failed
// delivery for its delay, it cancels its subscription, handles the
// deliveries the broker had already sent ahead (none is handed back), and
// subscribes again, under a consumer tag of its own, with a full
// prefetch; the held delivery is requeued later on the same channel.
// This costs two round trips to the broker per failed delivery, and
// nothing on the path of a handler that succeeds.
//
// It does so for up to Prefetch held deliveries (at least
// [DefaultPrefetch]). A delivery that fails while that many are held
// stays in its subscription's slot for its delay, and Run logs a warning:
// the subscription then takes one delivery fewer ahead, and none once all
// its slots are held, until the earliest delay ends; the messages behind
// stay in the queue for other consumers. So a flood of failing messages
// slows a consumer and never grows what it holds without end: Run never
// has more than that cap plus twice Prefetch deliveries unacknowledged.
//
// # Prefetch and channels
//
// [Consumer.Prefetch] sets the channel's QoS: how many unacknowledged
// deliveries the broker sends ahead, besides those held for their delay.
// Run handles one delivery at a time;
// for parallelism run several Consumers, each on its own channel. After a
// channel or connection closes, Run returns [ErrChannelClosed]: open a new
// channel and run again. Leave the client's automatic recovery off, since a
// recovered channel numbers its deliveries afresh and a late ack could
// then acknowledge the wrong message.
package rabbitmq
