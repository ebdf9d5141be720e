// Package nats consumes NATS JetStream pull consumers (through
// github.com/nats-io/nats.go/jetstream) into an [inbox.Handler], so that
// every message's effect happens once even though JetStream delivers at
// least once.
//
// It lives in its own module so that idemhttp's core does not depend on
// the NATS client. Its name is the same as the client's package, so
// import it under another name:
//
//	import natsinbox "github.com/idemkit/idemhttp/contrib/nats"
//
//	cons, err := js.Consumer(ctx, "ORDERS", "order-recorder") // durable, AckExplicit
//	...
//	handle := in.Handle("order-recorder", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
//		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.ID, m.Body)
//		return err
//	})
//	err = (&natsinbox.Consumer{}).Run(ctx, cons, handle)
//
// # Where the message id comes from
//
// From the Nats-Msg-Id header by default ([Consumer.IDHeader] names
// another). The producer sets it, and must set the same one when it
// publishes a message again because it never got the PubAck of the first
// publish. JetStream itself drops such a second copy when it arrives within
// the stream's duplicate window (Duplicates, 2 minutes by default); the
// inbox dedups what the window misses: a retry after the window, a copy
// that reached the stream another way, and every redelivery of a message
// whose ack was lost. The stream sequence is no substitute: it is stable
// across redeliveries but differs between two publishes of one message.
//
// A message with no id is never handled and never acked: it is terminated
// and reported through [Consumer.OnDeadLetter] and a log line
// ([NoIDTerm], the default; the server publishes a MSG_TERMINATED
// advisory naming it), or naked while Run stops with an error naming the
// stream ([NoIDStop]).
//
// Each message's [inbox.Message.IDSpace] is its stream (or
// [Consumer.IDSpace]), so an inbox shared by the consumers of two streams
// never takes one stream's message for a duplicate of the other's.
//
// # Ack policy
//
// The JetStream consumer must use AckExplicit. Run refuses AckNone (and so
// an ordered consumer) and AckAll with [ErrAckPolicy] before it pulls
// anything: with AckNone a message counts as acknowledged when it is sent,
// so a failed one never comes back; with AckAll, acking one message acks
// every earlier one, failed or still running.
//
// # Ack after commit
//
// Run acks a message only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// ack leaves it unacknowledged and the server redelivers it after the
// consumer's AckWait.
//
// # The message core and its ledger
//
// Every message goes through the message core of the inbox package
// ([inbox.Runner], see docs/consumer.md): it decides ack, nak (at once or
// with a delay) and term from evidence and from the inbox's own record of
// the message's handler runs, [Consumer.Ledger]; Run maps each decision
// onto JetStream's verbs and keeps no rule of its own. Give it the ledger
// of the handler's inbox:
//
//	c := &natsinbox.Consumer{Ledger: in.Ledger("order-recorder")}
//
// Run never decides from NumDelivered, which also counts the naks of
// shutdowns and of messages pulled ahead and handed back; and it refuses
// a consumer with a MaxDeliver limit ([ErrMaxDeliver]), past which the
// server would stop delivering a healthy message that met enough
// shutdowns.
//
// # Shutdown
//
// Cancelling Run's context loses nothing and counts nothing, whatever the
// settings: a message whose handler is running is acked if the handler
// returns nil (its effect committed) and naked for redelivery at once
// otherwise, never terminated, never counted as a failure. The pull in
// progress is not cut short, which would drop the messages the server
// sent and the client had not yet handed over, leaving them to AckWait:
// Run waits for it to end ([Consumer.MaxWait] at most, nothing when its
// batch is full) and naks, at once, every message it brought that the
// handler did not get.
//
// # Poison messages
//
// A handler error rolls its transaction back, the inbox row with it; the
// ledger counts the failure, and Run naks the message with a delay that
// doubles with each counted failure ([Consumer.Retry]: 1 s to 5 min by
// default), so nothing spins. On its [inbox.Retry.MaxDeliveries]-th
// failed run (5 by default) it is terminated (AckTerm: the server
// publishes a MSG_TERMINATED advisory with its stream sequence, for a
// dead-letter process to fetch it from the stream) and reported through
// [Consumer.OnDeadLetter] and a log line at level Error. A message that
// kills its client's process while its handler runs is counted too (the
// run of a redelivered message is recorded in the ledger before it
// starts; the first delivery is not, so it gets one run more than the
// limit), and once at the limit is terminated on arrival, without
// running. Keep the stream's retention (limits, not work-queue) long
// enough for the dead-letter process to read it.
//
// # A hung handler
//
// A handler runs for at most [Consumer.ProcessingLimit] (5 minutes by
// default). Then its context ends, which rolls an inbox transaction back
// (see [inbox.SQL]: the server's own timeouts end it even if the handler
// ignores its context), the heartbeats stop, the ledger counts a failure,
// and Run naks the message, so that another instance gets it at once;
// the messages pulled behind it are naked too, once their pull has ended,
// rather than held until AckWait behind it. Run waits for the handler to
// return and acks nothing it naked.
//
// # Across an upgrade
//
// The inbox's rows written by the previous release stay duplicates, and
// an instance of the previous release running beside this one during a
// rolling deploy agrees with it on every message id (see Formats and
// upgrades in the inbox package). The previous release decided from
// NumDelivered; this one counts in the ledger from the upgrade on. A
// consumer with a MaxDeliver limit, which the previous release accepted,
// is now refused: remove the limit before the upgrade.
//
// # Inbox retention
//
// JetStream redelivers a message for as long as the stream holds it (its
// MaxAge; none by default), and drops a producer's second publish of it
// only within the duplicate window (2 minutes by default). Keep the
// inbox's ids ([inbox.SQL.Prune], at least [inbox.SQL.MinRetention])
// longer than the stream's MaxAge, or than producers may republish.
//
// # AckWait and slow handlers
//
// While a handler runs, Run sends AckProgress ([Consumer.Heartbeat], a third
// of AckWait by default), which restarts AckWait: without it, a handler
// slower than AckWait would have its message redelivered to another
// instance while it is still running. The inbox would still keep the
// effect single (the second transaction waits on the first's row), but
// the work would be done twice up to the commit.
//
// # Redelivery to another instance
//
// Every instance pulling from one durable consumer shares its messages;
// there is no rebalance, and a redelivery goes to whichever instance
// pulls next, possibly while the first instance is still committing. The
// inbox serialises the two: the second transaction's insert of the same
// id waits for the first, then finds its row and runs nothing (or runs the
// effect, if the first rolled back).
package nats
