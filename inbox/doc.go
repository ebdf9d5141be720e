// Package inbox makes the effects of an at-least-once message consumer
// happen once: the consumer-side half of idemhttp.
//
// A broker that delivers at least once (Kafka, RabbitMQ, NATS JetStream,
// SQS) redelivers every message whose acknowledgement it did not get. A
// consumer that crashes after its side effect but before it acks (or
// commits its offset) gets the message again and, unless it remembers,
// runs the effect twice: two ledger rows, two e-mails, two charges.
//
// # The inbox
//
// When the effect is a write to a database the consumer owns, record the
// message id in the same transaction as the effect:
//
//	BEGIN;
//	INSERT INTO idemhttp_inbox (consumer, id, processed_at) VALUES (...) ON CONFLICT DO NOTHING;
//	-- a new row: run the effect here, in this transaction; no new row: a duplicate, run nothing
//	COMMIT;
//	-- then ack the message (commit the offset)
//
// The effect and the record commit together or not at all, so a crash at
// any point leaves either both (the redelivery finds the id and is a
// duplicate) or neither (the redelivery runs the effect for the first
// time). A concurrent redelivery of the same id blocks on the row the first
// one inserted until that transaction ends, so two consumers given the same
// message at once (a rebalance, a visibility timeout) run it once. The
// tempting alternative, checking for the id and then writing it separately,
// lets both see "not yet" and both run the effect; this package never does
// that, and its tests show it failing.
//
// [SQL] is the inbox for any database/sql driver of PostgreSQL or SQLite
// (3.24 or later); contrib/postgres has a pgx-native one with the same
// table and semantics, and contrib/sqlite opens an embedded SQLite database
// set up for it. [SQL.Handle] turns a function of the transaction into a
// [Handler], the broker-neutral callback the adapters (contrib/kafka and
// the others) call for each [Message]; they ack only after it returns nil.
//
// # Effects that are HTTP calls
//
// An effect that is a call to a third party's API cannot join the
// database transaction, and needs no inbox: send it with an idempotency key
// derived from the message, [DeriveKey], through an [idemhttp.Client]. Every
// redelivery derives the same key, and the server replays instead of acting
// twice, for as long as it keeps keys (24 hours at Stripe).
//
// # Offsets in the database
//
// A Kafka partition is an ordered log, so the consumer's position in it can
// replace the growing table of ids: store the next offset of each partition
// in the effect's transaction, skip any record below it, and seek to it when
// the partition is assigned. The table then holds one row per partition,
// forever. contrib/kafka does this; it dedups only redeliveries of the same
// record, not a producer's retries that wrote the message twice (see
// below).
//
// # The producer side
//
// The natural partner of the inbox is a transactional outbox: the producer
// writes the message in its business transaction, with an id fixed then,
// and a relay publishes it afterwards, resending under the same id after a
// crash, which the consumers' inboxes drop. contrib/postgres has one
// (Outbox).
//
// # Where the id comes from
//
// The id must be the same on every delivery of one logical message. A
// broker-assigned id (a Kafka offset, an SQS MessageId, a JetStream
// sequence) is, for redeliveries; but a producer that retries a publish
// after a lost acknowledgement writes a second message with a new broker
// id, which no broker id can match. Only an id the producer assigns once per
// logical message, before its first attempt, and sends as a header or
// property (as idemhttp's keys are minted before the first HTTP attempt)
// dedups those too. The adapters take the id from a configurable header and
// fall back to the broker's id only when told to.
//
// A message without an id cannot be deduplicated: the inbox refuses it with
// [ErrNoMessageID] and runs nothing, so by default it is not acked. Ids are
// stored as [StoredID] gives them: ids longer than [MaxIDLen] bytes, or not
// valid UTF-8, are replaced by their SHA-256, never refused or truncated
// (truncation could make two messages one).
//
// # Retention
//
// [SQL.Prune] deletes ids processed before a cutoff. After that, a
// redelivery of a pruned id runs its effect again: keep ids for longer than
// the broker can redeliver a message (SQS keeps messages up to 14 days; a
// Kafka consumer group that is reset or rewound re-reads as far back as the
// topic's retention; RabbitMQ redelivers unacked messages for ever), and
// longer than a producer may retry. A longer retention costs a bigger table
// (about 100 bytes per id plus its index) and nothing per message: the
// insert is an index probe whatever the size. When in doubt, keep more.
package inbox
