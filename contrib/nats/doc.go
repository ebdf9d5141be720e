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
// ([NoIDTerm], the default; the server publishes a MSG_TERMINATED advisory
// naming it), or naked while Run stops ([NoIDStop]).
//
// # Ack after commit, nak on error
//
// Run acks a message only after the handler returned nil, which for an
// inbox handler means after its transaction committed. A crash before the
// ack leaves it unacknowledged and the server redelivers it after the
// consumer's AckWait. A handler error naks it ([Consumer.NakDelay] delays
// the redelivery); its transaction rolled back, the inbox row with it, so
// the redelivery runs the effect again. The consumer's MaxDeliver bounds
// how often a message that always fails comes back.
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
