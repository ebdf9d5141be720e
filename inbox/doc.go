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
// [ErrNoMessageID] and runs nothing. An adapter never drops it silently:
// by default it dead-letters it or stops with an error naming the queue.
// Ids are stored as [StoredID] gives them: ids longer than [MaxIDLen]
// bytes, or not valid UTF-8, are replaced by their SHA-256, never refused
// or truncated (truncation could make two messages one).
//
// # Id spaces
//
// An id is unique within its source, not across sources: two queues may
// both carry a message "42". Adapters set [Message.IDSpace] to the queue,
// stream or topic a message came from, and [SQL.Handle] records ids per
// consumer and id space ([StoredConsumer]), so that one queue's message
// is never taken for a duplicate of another's. When several sources carry
// copies of the same logical messages (one producer publishing to two
// queues, a topic renamed), declare it: set the same IDSpace on their
// adapters, and the inbox dedups across them. [DeriveMessageKey] scopes
// idempotency keys the same way.
//
// # The message core
//
// One core decides what becomes of every delivery, for every adapter:
// [Delivery], a state machine with no driver, clock or goroutine, takes
// evidence (what the adapter saw on arrival, what the [Ledger] answered,
// how the handler ended) and returns decisions (a ledger write to make, a
// [Verb] for the broker). [Runner] is the one shell the adapters run
// deliveries through; they only map its final decision onto their
// broker's verbs. docs/consumer.md draws its states and transitions.
//
// Dead-lettering is decided from the inbox's own durable record of the
// message's handler runs, the [Ledger] (a table beside the inbox's:
// [SQL.Ledger]), never from a broker's delivery counter, which quorum
// queues, JetStream and SQS raise for every delivery, those a shutdown,
// a prefetch handed back or a neighbour's processing limit returned
// included. The ledger counts the runs that failed, and the runs begun
// and never ended: before the handler of a message the broker may have
// delivered before runs, the run is recorded, in a transaction of its
// own, so that a process that dies in it leaves the run counted. (A first
// delivery is not so recorded, which would cost a write per message: a
// message that kills its process is counted from its second run on.)
//
// What every adapter guarantees, each with its broker's means (their
// package documentation says how):
//
//   - Shutdown loses nothing and counts nothing: when Run's context ends
//     while a handler runs, its message goes back to the broker, to be
//     delivered again, whatever the settings, and so do the messages
//     taken ahead of it; a message already handed back is never acked
//     afterwards; nothing is counted against the message.
//   - A message whose handler fails is delivered again after a delay that
//     grows with each counted failure ([Retry]), never at once, so that a
//     database outage or a poison message cannot spin a consumer. After
//     [Retry.MaxDeliveries] failed runs it goes to the broker's
//     dead-letter destination (a dead-letter exchange, a terminated
//     message, a dead-letter topic; on SQS, its redrive policy, by SQS's
//     own count) and is reported, through a hook and one log line
//     ([ReportDeadLetter]). A message that arrives having failed that
//     often already (it kept killing its consumers) is dead-lettered
//     without running. Nothing is dropped silently.
//   - A hung handler cannot hold its message for ever: past the adapter's
//     processing limit its context ends, the failure is counted, the
//     message is handed back for redelivery (heartbeats and visibility
//     extensions stop), and so are those taken ahead of it; the inbox's
//     transaction cannot outlive the limit (see [SQL]), so that the
//     redelivery, which waits on the first delivery's row, gets it. The
//     adapter's Run waits for the handler to return before it takes the
//     next message, so that no goroutine outlives Run.
//
// Two imprecisions are on the side of a longer life for the message, or
// bounded: a run begun by a delivery of the message that is live
// elsewhere at the same moment (a copy delivered twice at once) is
// counted as one that died, and so is a shutdown whose excuse the ledger
// could not write (the database unreachable at that moment). The first
// can decide a dead letter while that run still works; the dead letter's
// tombstone ([OpTombstone]), written in the inbox's row of the id before
// the dead letter, conflicts with the run's effect, so that the two never
// both commit. Clear a tombstone with [SQLLedger.Redrive] before you
// redrive its message from the dead-letter destination: until then a
// delivery of its id is dead-lettered again, unrun.
//
// # Formats and upgrades
//
// Every table of the inbox carries a format in each row (its format
// column). The inbox table's: 1, the previous release's (every message of
// a consumer recorded under its plain name, whatever its source; the
// column's default, so also what an instance of that release writes
// during a rolling deploy); 2, this release's record of a message in its
// id space; 3, this release's copy, under the consumer's plain name, of
// the record of a message with an id space; 4, a dead letter's tombstone
// ([OpTombstone]: the message was dead-lettered, its effect can no
// longer commit; [SQLLedger.Redrive] clears it before an operator
// redrives the message, which the previous release would read as a
// processed id). [SQL.Migrate] adds the column
// to a table of the previous release in place. An id recorded before the
// upgrade stays a duplicate in every id space, and an instance of the
// previous release running beside this one finds the copy, and waits on
// its row while this one processes the message: the two agree on every
// message id. The ledger's table is new (format 1). The next release
// stops writing copies, once no instance of the previous one can run
// (see RELEASING.md).
//
// [DeriveMessageKey] keys a message with an id space differently from
// [DeriveKey], which the previous release's consumers used: do not switch
// an HTTP effect from one to the other while messages whose calls were
// made under the old keys may be redelivered (within the server's key
// retention), or the server runs them again.
//
// # Retention
//
// [SQL.Prune] deletes ids processed before a cutoff, by the database's
// clock. After that, a redelivery of a pruned id runs its effect again:
// keep ids for longer than the broker can redeliver a message after its
// effect committed, and longer than a producer may retry. Prune refuses a
// retention under [SQL.MinRetention] (15 days by default,
// [DefaultMinRetention]). Per broker:
//
//   - SQS keeps a message at most 14 days (its MessageRetentionPeriod) and
//     hides it at most 12 hours: 15 days covers every queue.
//   - Kafka: a consumer group that is reset or rewound re-reads as far
//     back as the topic's retention.ms (7 days by default; forever for a
//     compacted topic). Keep ids at least that long, or use SQLOffsets,
//     which needs no retention.
//   - RabbitMQ redelivers a message for as long as it sits unacknowledged
//     in a queue: there is no bound from the broker. Keep ids longer than
//     a queue may go unconsumed.
//   - NATS JetStream redelivers while the stream holds the message: its
//     MaxAge (none by default), and its duplicate window (2 minutes by
//     default) for a producer's retries.
//
// A longer retention costs a bigger table (about 100 bytes per id plus its
// index) and nothing per message: the insert is an index probe whatever
// the size. When in doubt, keep more.
package inbox
