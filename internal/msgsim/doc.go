//go:build go1.26

// Package msgsim is a deterministic simulator of the consumer side (issue
// 32 §1.4): the real message core (inbox.Delivery, run by inbox.Runner)
// and the real inbox (inbox.SQL's Handle and its ledger, inbox.SQLLedger,
// through database/sql) against a modelled at-least-once broker and a
// modelled transactional database, over many seeded worlds, with the
// invariants of effectively-once consumption checked in each
// (docs/simulation.md, the consumers' section, says how to run it, what
// it models and what it does not).
//
// Each seed draws its world (Config): a queue whose broker counts every
// delivery (quorum queues, JetStream, SQS) or only flags a redelivery
// (classic queues), or a Kafka topic of partitions with committed
// offsets; two or three consumer processes with a prefetch; a processing
// limit; handlers that are healthy, slow, poisoned, flaky, that kill
// their process or hang past the limit; producer duplicates; and faults:
// shutdowns in the middle of a batch, crashes at any step (a process's
// memory gone, its deliveries returned, its transactions rolled back),
// ack waits that end while a handler runs (another consumer gets the
// message), rebalances that move a partition while its owner still
// works, a database that is unreachable or fails a commit (before it
// applies, or after: the answer lost). Queue worlds may also run their
// deliveries in batches (inbox.SQL's ProcessBatch), take a second queue's
// messages whose ids collide with the first's (Message.IDSpace), carry
// messages without an id, have an operator redrive dead letters
// (SQLLedger.Redrive, then published again), prune the inbox at the age
// the docs require (inbox.SQL's Prune), and give each delivery an ack
// wait that the Runner's beats renew; the producer's duplicates may come
// late, once their originals are settled.
//
// One driver goroutine takes one step at a time: it lets one waiting
// turn go (every statement, commit and call to the broker waits for
// one), injects a fault, or lets virtual time pass (testing/synctest),
// and between two steps waits until every other goroutine of the bubble
// is durably blocked. Same seed, same run: TestMsgSim runs a sample of
// seeds twice, and TestMsgSimSameSeedSameTrace compares whole traces.
//
// It needs Go 1.26, as internal/sim does (Go 1.25.0's synctest does not
// count a goroutine in sync.WaitGroup.Wait, where inbox.Supervise waits,
// as blocked).
package msgsim
