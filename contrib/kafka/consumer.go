// Package kafka feeds the records of a Kafka consumer group to an
// [inbox.Handler] with github.com/twmb/franz-go, committing each
// partition's offset only after the handler returned nil for the records
// before it.
//
// Two ways to make the effects happen once:
//
//   - The inbox: the handler is an inbox's (inbox.SQL.Handle, or
//     contrib/postgres's Inbox.Handle), which records each message id in the
//     effect's transaction. Ids come from a producer-assigned header
//     ([Config.IDHeader]), which also dedups a producer's own retries: a
//     producer that resends after a lost acknowledgement writes the message
//     at a second offset, and only an id it chose once can match the two.
//   - Offsets in the database ([SQLOffsets]): the handler stores the
//     partition's next offset in the effect's transaction and skips any
//     record below it, and the consumer seeks to the stored offsets when
//     partitions are assigned. The table holds one row per partition
//     instead of one per message, but dedups only redeliveries of the same
//     record, not a producer's duplicates.
//
// # Committed records only
//
// The consumer reads with the read-committed isolation level (franz-go's
// default is read-uncommitted): a transactional producer's aborted records
// are never handed to the handler, and the records of an open transaction
// only once it commits. An option kgo.FetchIsolationLevel(kgo.ReadUncommitted())
// among NewConsumer's opts overrides it; do not, unless no producer of the
// topics is transactional.
//
// # Commits, failures and rebalances
//
// The consumer polls with BlockRebalanceOnPoll, so the group cannot
// rebalance while it processes a poll's records and commits their offsets:
// a partition moves to another member only between polls, after its
// offsets are committed. Offsets go to Kafka after the handler's
// transaction committed, never before, so a crash between the two
// (the case the inbox exists for) redelivers records whose effects are
// done, and the inbox skips them.
//
// Every record goes through the message core ([inbox.Runner]), which
// decides from the inbox's own record of the record's handler runs
// ([Config.Ledger]); the consumer maps its decisions onto franz-go's
// verbs. When the handler fails for a record, the consumer commits what
// came before it, seeks the partition back to the failed record and
// pauses that partition, alone, for [Config.Retry]'s delay, which doubles
// with each failure of the record: the other partitions go on meanwhile,
// and a partition never skips a record it could not process. The record
// that fails [inbox.Retry.MaxDeliveries] times (5 by default), its runs
// that killed their process included, is dead-lettered: handed to
// [Config.DeadLetter], or produced to [Config.DeadLetterTopic], and then
// its offset committed at once, before anything after it runs (its ledger
// record is forgotten with the dead letter; with an inbox's ledger, its
// tombstone stays, so that a delivery of it again, a zombie's, is
// dead-lettered again, unrun: see [inbox.OpTombstone]; clear it with the
// ledger's Redrive before redriving the record), and reported through [Config.OnDeadLetter] and a log line;
// one that arrives having failed that often already (it kept killing the
// members that ran it) is dead-lettered without running. With neither
// destination, it holds its partition, retried after its growing delay
// (up to Retry.MaxDelay), and every failure from MaxDeliveries on is
// reported, so that the block is never silent. A record without an id
// goes to the destination at once (it will never get one), and with no
// dead-letter destination Run stops with an error naming the record.
//
// A run the process dies in is counted only when it was marked in the
// ledger before it started, which costs a write: the consumer marks the
// records that may have been delivered before, those within
// MaxPollRecords of where a partition was assigned to it, restarted or
// sought back. A record that kills its member is so counted from its
// first run on the member that takes its partition over.
//
// # Shutdown
//
// Cancelling Run's context loses nothing and counts nothing: a record
// whose handler is running is committed only if the handler returns nil;
// otherwise it is delivered again, from the last committed offset, to
// whichever member owns its partition next, and it is never counted as a
// failure nor dead-lettered for it, however often it happens. The records
// of the poll not yet handled are not committed either, and come again.
//
// # Inbox retention
//
// A consumer group that is reset or rewound re-reads as far back as the
// topic's retention.ms (7 days by default; for ever on a compacted topic),
// and every record read again is a redelivery. Keep the inbox's ids
// ([inbox.SQL.Prune], at least [inbox.SQL.MinRetention]) longer than the
// topic's retention, or use [SQLOffsets], which needs no retention.
//
// # A hung handler
//
// A handler runs for at most [Config.ProcessingLimit] (5 minutes by
// default): then its context ends, which rolls an inbox transaction back
// (see [inbox.SQL]: the server's own timeouts end it even if the handler
// ignores its context), and the record counts as failed. Run waits for the
// handler to return. A handler that ignores its context holds its
// partitions, and blocks the group's rebalances, until it returns; the
// group's rebalance timeout then moves its partitions to other members,
// which redeliver from the last commit, and the inbox (or the stored
// offset's row lock) lets only one of them commit the effect. Kafka has
// no way to hand one record to another member: the records behind a hung
// one in its partition wait for it (other partitions do not).
//
// # Across an upgrade
//
// [SQLOffsets.Migrate] upgrades the offsets table of the previous release
// in place (it adds topic_id and a format column): the consumer starts
// each partition where that release left it, and an instance of it
// running beside this one during a rolling deploy advances the same rows.
// The inbox's rows written by the previous release stay duplicates (see
// Formats and upgrades in the inbox package). What the previous release
// counted in a Run's memory is not carried over: a poison record's count
// starts again in the ledger.
package kafka

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idemhttp/inbox"
)

// DefaultIDHeader is the record header that carries the message id unless
// [Config.IDHeader] names another.
const DefaultIDHeader = "message-id"

// Headers of the records [Consumer] produces to [Config.DeadLetterTopic]:
// where the record came from, and why it was dead-lettered. The record's
// own key, value and headers come with them.
const (
	HeaderDeadLetterTopic     = "idemhttp-dead-letter-topic"
	HeaderDeadLetterPartition = "idemhttp-dead-letter-partition"
	HeaderDeadLetterOffset    = "idemhttp-dead-letter-offset"
	HeaderDeadLetterError     = "idemhttp-dead-letter-error"
)

// Config says what a [Consumer] consumes and how it hands records over.
type Config struct {
	// Group is the consumer group; required. With the inbox it is a good
	// consumer name too.
	Group string

	// Topics are the topics to consume; at least one.
	Topics []string

	// Handler processes each record, as an [inbox.Message] whose Raw is the
	// *kgo.Record; required. The record's offset is committed only after it
	// returns nil.
	Handler inbox.Handler

	// IDHeader names the record header holding the producer-assigned
	// message id; empty means [DefaultIDHeader].
	IDHeader string

	// IDFromOffset, when the header is missing, makes the id the record's
	// position ([OffsetID]) instead of leaving it empty. Such an id dedups
	// redeliveries of the record but not a producer's retries that wrote
	// it twice. [SQLOffsets] does not need ids at all.
	IDFromOffset bool

	// IDSpace is the [inbox.Message.IDSpace] of the records: the space in
	// which their ids are unique. Empty means the record's topic. Set it
	// to declare that the ids of all the topics are one space (copies of
	// the same messages), which the inbox then dedups across them.
	IDSpace string

	// DeadLetter, when set, receives each record that is dead-lettered
	// (one without an id, or whose handler failed Retry.MaxDeliveries
	// times) instead of Handler; when it returns nil the record is
	// committed, and reported. With [SQLOffsets], make it with
	// SQLOffsets.Handle, so that the stored offset moves past the record
	// in the same transaction. When it fails, the record is retried
	// like a handler failure.
	DeadLetter inbox.Handler

	// DeadLetterTopic, when set and DeadLetter is not, is the topic a
	// dead-lettered record is produced to (synchronously, with its key,
	// value and headers, and the Header* headers of this package), before
	// it is committed and reported. It cannot be combined with Positions:
	// the stored offset would stay behind the record.
	DeadLetterTopic string

	// Positions, when set, is consulted when partitions are assigned: the
	// consumer starts each partition at the offset it stores instead of the
	// group's committed offset. Set it to the [SQLOffsets] whose Handle
	// makes Handler.
	Positions PositionStore

	// Retry says how long a partition whose record failed pauses before
	// the record is delivered again (1 s, doubling with each failure of
	// the record, up to 5 min, by default), and after how many failures
	// the record is dead-lettered (5). Only the failing partition pauses.
	// Failures are counted by Ledger.
	Retry inbox.Retry

	// Ledger counts each record's failed handler runs, and the runs its
	// process died in, for every member and restart: give it the inbox's
	// (inbox.SQL.Ledger, contrib/postgres's Inbox.Ledger) with the
	// consumer name of the handler's inbox (with SQLOffsets, the inbox.SQL
	// on the same database: records without ids are counted under their
	// OffsetID). Nil means a count of this Run's own
	// ([inbox.MemoryLedger]): a poison record then gets up to
	// Retry.MaxDeliveries failures per Run, and one that kills its
	// process is never counted.
	Ledger inbox.Ledger

	// ProcessingLimit bounds how long one record's handler runs: past it,
	// the handler's context ends and the record counts as failed. Zero
	// means [inbox.DefaultProcessingLimit]; negative means no limit.
	ProcessingLimit time.Duration

	// MaxPollRecords bounds the records of one poll; zero means 500.
	MaxPollRecords int

	// OnError, when set, is told of errors the consumer handles by itself
	// and goes on after: handler failures (retried), failed offset commits
	// (the next commit covers them; until then a restart redelivers, which
	// the inbox absorbs) and fetch errors. Nil ignores them.
	OnError func(error)

	// OnDeadLetter, when set, is called (from Run's goroutine) for each
	// record dead-lettered, and for each failure of a record that holds
	// its partition past Retry.MaxDeliveries. Run also logs each at level
	// Error.
	OnDeadLetter func(inbox.DeadLetter)

	// Logger receives the consumer's log lines; nil means
	// [slog.Default].
	Logger *slog.Logger
}

// PositionStore keeps consumer groups' offsets outside Kafka, in the
// database of the effects. [SQLOffsets] is one.
type PositionStore interface {
	// Positions returns the next offset to consume of the partitions of
	// group it has stored; a partition it has none of is absent. ids holds
	// the topic ID of each topic, when the cluster gave one (Kafka 2.8 and
	// later): a stored offset of another incarnation of the topic (deleted
	// and created again) is not the new one's.
	Positions(ctx context.Context, group string, partitions map[string][]int32, ids map[string][16]byte) (map[string]map[int32]int64, error)
}

// Consumer runs [Config.Handler] on the records of a consumer group. It is
// not safe for concurrent use: one goroutine calls [Consumer.Run], and
// then [Consumer.Close].
type Consumer struct {
	cl    *kgo.Client
	cfg   Config
	ready chan struct{} // closed once cl is set: the client calls back as soon as it exists
}

// NewConsumer returns a Consumer for cfg. opts configure the franz-go
// client (kgo.SeedBrokers at least; TLS, SASL, ...). NewConsumer sets the
// read-committed isolation level before opts (see the package
// documentation), and adds the group, the topics, DisableAutoCommit and
// BlockRebalanceOnPoll after them, which the commit order depends on, so
// opts must not change those.
func NewConsumer(cfg Config, opts ...kgo.Opt) (*Consumer, error) {
	if cfg.Group == "" || len(cfg.Topics) == 0 || cfg.Handler == nil {
		return nil, errors.New("idemhttp/kafka: Config.Group, Config.Topics and Config.Handler are required")
	}
	if cfg.DeadLetterTopic != "" && cfg.Positions != nil && cfg.DeadLetter == nil {
		return nil, errors.New("idemhttp/kafka: Config.DeadLetterTopic cannot be used with Positions (the stored offset would stay behind the record): set DeadLetter to a SQLOffsets.Handle")
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = DefaultIDHeader
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = 500
	}
	if cfg.ProcessingLimit == 0 {
		cfg.ProcessingLimit = inbox.DefaultProcessingLimit
	}
	c := &Consumer{cfg: cfg, ready: make(chan struct{})}
	all := []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}
	all = append(all, opts...)
	all = append(all,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
	)
	if cfg.Positions != nil {
		all = append(all, kgo.AdjustFetchOffsetsFn(c.adjustOffsets))
	}
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/kafka: new client: %w", err)
	}
	c.cl = cl
	close(c.ready)
	return c, nil
}

// Client returns the franz-go client, for metrics or admin calls. Do not
// poll or commit with it.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Close leaves the group and closes the client. Offsets of records whose
// handler returned nil have been committed already, by Run.
func (c *Consumer) Close() { c.cl.Close() }

// adjustOffsets starts every newly assigned partition at the offset the
// PositionStore holds for it, if any.
func (c *Consumer) adjustOffsets(ctx context.Context, assigned map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	parts := make(map[string][]int32, len(assigned))
	for t, ps := range assigned {
		for p := range ps {
			parts[t] = append(parts[t], p)
		}
	}
	ids, err := c.topicIDs(ctx, parts)
	if err != nil {
		// Without the topic's identity, a stored offset of a deleted
		// topic could skip the new topic's records: retry the join.
		return nil, fmt.Errorf("idemhttp/kafka: topic ids: %w", err)
	}
	stored, err := c.cfg.Positions.Positions(ctx, c.cfg.Group, parts, ids)
	if err != nil {
		// Consuming from the group's offsets instead is safe (the stored
		// positions still skip what is done) but may redeliver a lot; an
		// error makes franz-go retry the join.
		return nil, fmt.Errorf("idemhttp/kafka: load positions: %w", err)
	}
	for t, ps := range stored {
		for p, next := range ps {
			if _, ok := assigned[t][p]; ok {
				assigned[t][p] = kgo.NewOffset().At(next).WithEpoch(-1)
			}
		}
	}
	return assigned, nil
}

// topicIDs asks the cluster for the IDs of topics (none for a cluster
// that has none).
func (c *Consumer) topicIDs(ctx context.Context, topics map[string][]int32) (map[string][16]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	for t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, c.cl)
	if err != nil {
		return nil, err
	}
	ids := make(map[string][16]byte, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil && t.TopicID != ([16]byte{}) {
			ids[*t.Topic] = t.TopicID
		}
	}
	return ids, nil
}

// topicPartition names one partition.
type topicPartition struct {
	topic     string
	partition int32
}

// runState is the state of one Run: the partitions paused after a
// failure, and until when; for each partition, the offset after the last
// record settled and where the records that may have been delivered
// before (after an assignment, a restart or a seek) begin.
type runState struct {
	runner *inbox.Runner
	resume map[topicPartition]time.Time
	next   map[topicPartition]int64
	window map[topicPartition]int64
}

// maybeRedelivered reports whether the record at offset of tp may have
// been delivered before: a record that does not follow the last one this
// Run settled starts a window (a partition newly assigned, or sought
// back), and every record within MaxPollRecords of its start may be one
// an earlier member or run was handling when it died. It decides only
// whether a run is worth a durable marker (see inbox.Arrival).
func (st *runState) maybeRedelivered(tp topicPartition, offset int64, window int) bool {
	if next, ok := st.next[tp]; !ok || next != offset {
		st.window[tp] = offset
	}
	return offset < st.window[tp]+int64(window)
}

// Run polls and processes records until ctx ends, the client is closed,
// or a record without an id meets a consumer with no dead-letter
// destination, and returns ctx's error, [kgo.ErrClientClosed], or an error
// wrapping [inbox.ErrNoMessageID] that names the record. Records of one
// partition are processed one at a time, in order; the offsets of a
// poll's processed records are committed before the next poll, and a
// dead-lettered record's at once, before the next record of its
// partition runs. A partition whose record failed pauses, alone, for the
// retry delay.
func (c *Consumer) Run(ctx context.Context) error {
	st := &runState{runner: c.runner(), resume: make(map[topicPartition]time.Time),
		next: make(map[topicPartition]int64), window: make(map[topicPartition]int64)}
	for {
		c.resumeDue(st)
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if next, ok := st.nextResume(); ok {
			pollCtx, cancel = context.WithDeadline(ctx, next)
		}
		fetches := c.cl.PollRecords(pollCtx, c.cfg.MaxPollRecords)
		cancel()
		if fetches.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		if err := ctx.Err(); err != nil {
			c.cl.AllowRebalance()
			return err
		}
		var stop error
		globalWait := false
		fetches.EachError(func(t string, p int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return // the poll's deadline: a paused partition is due
			}
			c.report(fmt.Errorf("idemhttp/kafka: fetch %s/%d: %w", t, p, err))
			if p < 0 {
				globalWait = true // not a partition's: wait before polling again, not spin
				return
			}
			c.pause(st, topicPartition{t, p}, c.cfg.Retry.After(1))
		})
		var done []*kgo.Record
		fetches.EachTopic(func(ft kgo.FetchTopic) {
			for _, fp := range ft.Partitions {
				if stop != nil {
					if len(fp.Records) > 0 {
						c.seek(st, topicPartition{ft.Topic, fp.Partition}, fp.Records[0]) // not handled: fetched again
					}
					continue
				}
				last, err := c.processPartition(ctx, st, ft.Topic, ft.TopicID, fp.Partition, fp.Records)
				if last != nil {
					done = append(done, last)
				}
				stop = err
			}
		})
		if len(done) > 0 {
			// Only now, after every transaction of these records
			// committed. A failed commit is not fatal: the records are
			// redelivered after a restart, and the inbox skips them.
			if err := c.cl.CommitRecords(context.WithoutCancel(ctx), done...); err != nil {
				c.report(fmt.Errorf("idemhttp/kafka: commit offsets: %w", err))
			}
		}
		c.cl.AllowRebalance()
		if stop != nil {
			return stop
		}
		if globalWait {
			t := time.NewTimer(c.cfg.Retry.After(1))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// nextResume returns the earliest time a paused partition is due.
func (st *runState) nextResume() (time.Time, bool) {
	var next time.Time
	for _, t := range st.resume {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	return next, !next.IsZero()
}

// resumeDue resumes the partitions whose pause has ended.
func (c *Consumer) resumeDue(st *runState) {
	now := time.Now()
	var due map[string][]int32
	for tp, t := range st.resume {
		if !t.After(now) {
			if due == nil {
				due = make(map[string][]int32)
			}
			due[tp.topic] = append(due[tp.topic], tp.partition)
			delete(st.resume, tp)
		}
	}
	if due != nil {
		c.cl.ResumeFetchPartitions(due)
	}
}

// pause stops fetching tp for d.
func (c *Consumer) pause(st *runState, tp topicPartition, d time.Duration) {
	c.cl.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	st.resume[tp] = time.Now().Add(d)
}

// processPartition runs rs in order through the message core
// (inbox.Runner) and maps its decisions: an acked record is the last to
// commit; a record to requeue is sought back, and its partition paused
// for the delay, so that nothing after it is handled before it; a record
// to dead-letter goes to the dead-letter destination and is committed at
// once (commitDead). It returns the last record it settled, and an error
// only when Run must stop.
func (c *Consumer) processPartition(ctx context.Context, st *runState, topic string, topicID [16]byte, partition int32, rs []*kgo.Record) (*kgo.Record, error) {
	tp := topicPartition{topic, partition}
	var last *kgo.Record
	for _, r := range rs {
		m := c.message(r, topicID)
		key := inbox.Key{IDSpace: m.IDSpace, ID: m.ID}
		if key.ID == "" && c.cfg.Positions != nil {
			key.ID = OffsetID(r) // SQLOffsets dedups by position, not by id
		}
		arrival := inbox.Arrival{HasID: key.ID != "", Stopping: ctx.Err() != nil,
			MaybeRedelivered: st.maybeRedelivered(tp, r.Offset, c.cfg.MaxPollRecords)}
		dec, d := st.runner.Deliver(ctx, m, key, arrival, inbox.Hooks{})
		switch dec.Verb {
		case inbox.VerbAck:
			last = r
			st.next[tp] = r.Offset + 1
			continue
		case inbox.VerbDeadLetter:
			if !c.settleDead(ctx, st, tp, r, m, dec, d, key) {
				return last, nil
			}
			last = r
			st.next[tp] = r.Offset + 1
			if !c.commitDead(ctx, st, tp, r) {
				return last, nil
			}
			continue
		case inbox.VerbStop:
			c.seek(st, tp, r)
			return last, fmt.Errorf("idemhttp/kafka: %s offset %d: %w (set Config.DeadLetter or DeadLetterTopic to move such records aside)", m.Source, r.Offset, dec.Err)
		case inbox.VerbRequeue:
			// Not committed: delivered again from here, after the delay,
			// or at once (a shutdown, never counted).
			c.seek(st, tp, r)
			if dec.Delay > 0 && ctx.Err() == nil {
				if dec.Report || (c.holds() && c.cfg.Retry.Exhausted(dec.Failures)) {
					c.reportDead(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err,
						To: "nowhere: it holds its partition, retried after its delay (set Config.DeadLetter or DeadLetterTopic)"})
				}
				c.report(fmt.Errorf("idemhttp/kafka: %s offset %d: not committed, will retry: %w", m.Source, r.Offset, dec.Err))
				c.pause(st, tp, dec.Delay)
			}
			return last, nil
		}
		// No decision (a refused move: a bug): not committed, delivered
		// again.
		c.seek(st, tp, r)
		return last, dec.Err
	}
	return last, nil
}

// settleDead hands r, which the core dead-lettered, to the dead-letter
// destination, tells the core how that went (its ledger record goes only
// once the dead letter is done), reports it, and says whether it may be
// committed. When the destination fails, r is sought back and its
// partition paused for the core's delay: its record kept with its count,
// it comes back and is dead-lettered on arrival, without running.
func (c *Consumer) settleDead(ctx context.Context, st *runState, tp topicPartition, r *kgo.Record, m *inbox.Message, dec inbox.Decision, d *inbox.Delivery, key inbox.Key) bool {
	to, err := c.deadLetter(ctx, r, m, dec.Err)
	after := st.runner.DeadLettered(ctx, d, key, err)
	if err != nil {
		c.report(fmt.Errorf("idemhttp/kafka: %s offset %d: dead-lettering failed, will retry: %w (after: %w)", m.Source, r.Offset, err, dec.Err))
		c.seek(st, tp, r)
		c.pause(st, tp, after.Delay)
		return false
	}
	c.reportDead(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: to})
	return true
}

// commitDead commits the offset after r, which was just dead-lettered,
// before anything after it in its partition runs, and says whether the
// partition may go on.
//
// The dead letter is done and forgot the message's ledger record (the
// core forgets a settled message), so r must not be delivered again: run
// again, it would start from no failures and be dead-lettered a second
// time (with an inbox's ledger its tombstone dead-letters it again, unrun;
// with a MemoryLedger it could succeed: an effect and a dead letter). Left to the poll's commit, a later record of the poll
// that kills the member (the producer's duplicate of r, with r's id, say)
// brings r back, again and again: the partition never got past them
// (internal/msgsim, seed 272). Committing here is the adapter's own
// settling of a dead letter, as a queue's reject is. (A zombie's dead
// letter, which cannot commit, is met by the message's tombstone in the
// inbox, inbox.OpTombstone: the new owner dead-letters the record again,
// unrun.)
//
// When the commit fails, the partition stops here: sought to the record
// after r and paused for the first retry delay, with r the last record
// of the poll's commit, which tries again.
func (c *Consumer) commitDead(ctx context.Context, st *runState, tp topicPartition, r *kgo.Record) bool {
	err := c.cl.CommitRecords(context.WithoutCancel(ctx), r)
	if err == nil {
		return true
	}
	c.report(fmt.Errorf("idemhttp/kafka: %s/%d offset %d: commit after its dead letter: %w", r.Topic, r.Partition, r.Offset, err))
	c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{
		r.Topic: {r.Partition: {Epoch: r.LeaderEpoch, Offset: r.Offset + 1}},
	})
	c.pause(st, tp, c.cfg.Retry.After(1))
	return false
}

// holds reports whether a record that fails as often as allowed holds its
// partition: there is no dead-letter destination.
func (c *Consumer) holds() bool { return c.cfg.DeadLetter == nil && c.cfg.DeadLetterTopic == "" }

// runner is the message core's shell for one Run: the processing limit
// is the handler's own (callHandler), as a Kafka record cannot be handed
// to another member while its partition is this one's: past it the
// record counts as failed.
func (c *Consumer) runner() *inbox.Runner {
	p := inbox.Policy{Retry: c.cfg.Retry}
	if c.holds() {
		// Nowhere to dead-letter to: no limit; the record holds its
		// partition, retried with a delay that grows up to MaxDelay, and
		// is reported from Retry.MaxDeliveries failures on.
		p.Retry.MaxDeliveries = -1
		p.NoID = inbox.NoIDStop
	}
	return &inbox.Runner{Policy: p, Ledger: c.cfg.Ledger, Handler: c.callHandler}
}

// seek makes the next fetch of r's partition start at r, and makes r the
// start of a window of records that may have been delivered before (see
// maybeRedelivered): r was. Without the window, a record sought back
// right after the last one settled ran again with no durable marker, so
// the core never read its count before running it: a record whose dead
// letter landed with its answer lost (its count kept, exhausted) ran
// again, and, succeeding, had both its effect and a dead letter
// (internal/msgsim, seed 870).
func (c *Consumer) seek(st *runState, tp topicPartition, r *kgo.Record) {
	delete(st.next, tp)
	c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{
		r.Topic: {r.Partition: {Epoch: r.LeaderEpoch, Offset: r.Offset}},
	})
}

// callHandler runs the handler under the processing limit.
func (c *Consumer) callHandler(ctx context.Context, m *inbox.Message) error {
	if c.cfg.ProcessingLimit < 0 {
		return c.cfg.Handler(ctx, m)
	}
	hctx, cancel := context.WithTimeout(ctx, c.cfg.ProcessingLimit)
	defer cancel()
	err := c.cfg.Handler(hctx, m)
	if err != nil && hctx.Err() != nil && ctx.Err() == nil {
		err = fmt.Errorf("processing limit (%v) passed: %w", c.cfg.ProcessingLimit, err)
	}
	return err
}

// deadLetter hands r to the dead-letter destination and says where it
// went; "" means there is none. cause is why.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, m *inbox.Message, cause error) (string, error) {
	switch {
	case c.cfg.DeadLetter != nil:
		return "Config.DeadLetter", c.cfg.DeadLetter(ctx, m)
	case c.cfg.DeadLetterTopic != "":
		dl := &kgo.Record{
			Topic: c.cfg.DeadLetterTopic,
			Key:   r.Key,
			Value: r.Value,
			Headers: append(append([]kgo.RecordHeader(nil), r.Headers...),
				kgo.RecordHeader{Key: HeaderDeadLetterTopic, Value: []byte(r.Topic)},
				kgo.RecordHeader{Key: HeaderDeadLetterPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
				kgo.RecordHeader{Key: HeaderDeadLetterOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
				kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(cause.Error())},
			),
		}
		to := "topic " + c.cfg.DeadLetterTopic
		if err := c.cl.ProduceSync(ctx, dl).FirstErr(); err != nil {
			return to, fmt.Errorf("produce to %s: %w", c.cfg.DeadLetterTopic, err)
		}
		return to, nil
	}
	return "", nil
}

// topicIDKey is the key under which the consumer puts a record's topic ID
// in its Context (franz-go's place for a consumer's enrichment of
// records).
type topicIDKey struct{}

// RecordTopicID returns the ID of the topic incarnation r was fetched
// from, as a [Consumer] recorded it; false when there is none (a record
// that did not come from a Consumer, or a cluster older than Kafka 3.1).
func RecordTopicID(r *kgo.Record) ([16]byte, bool) {
	if r == nil || r.Context == nil {
		return [16]byte{}, false
	}
	id, ok := r.Context.Value(topicIDKey{}).([16]byte)
	return id, ok && id != [16]byte{}
}

// message turns r, fetched from the topic whose ID is topicID, into the
// Message handlers see.
func (c *Consumer) message(r *kgo.Record, topicID [16]byte) *inbox.Message {
	if topicID != ([16]byte{}) {
		parent := r.Context
		if parent == nil {
			parent = context.Background()
		}
		r.Context = context.WithValue(parent, topicIDKey{}, topicID)
	}
	m := &inbox.Message{
		Source:  r.Topic + "/" + strconv.Itoa(int(r.Partition)),
		IDSpace: c.cfg.IDSpace,
		Body:    r.Value,
		Time:    r.Timestamp,
		Raw:     r,
	}
	if m.IDSpace == "" {
		m.IDSpace = r.Topic
	}
	if len(r.Headers) > 0 {
		m.Header = make(map[string][]string, len(r.Headers))
		for _, h := range r.Headers {
			m.Header[h.Key] = append(m.Header[h.Key], string(h.Value))
			if h.Key == c.cfg.IDHeader && m.ID == "" {
				m.ID = string(h.Value)
			}
		}
	}
	if m.ID == "" && c.cfg.IDFromOffset {
		m.ID = OffsetID(r)
	}
	return m
}

// OffsetID is the id of a record by its position: "topic/partition/offset",
// and, when the record's topic ID is known ([RecordTopicID]),
// "topic@<topic ID in hex>/partition/offset", so that a topic deleted and
// created again, whose offsets start over, does not give its records the
// ids of the old incarnation's.
func OffsetID(r *kgo.Record) string {
	topic := r.Topic
	if id, ok := RecordTopicID(r); ok {
		topic += "@" + hex.EncodeToString(id[:])
	}
	return topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

func (c *Consumer) report(err error) {
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}

func (c *Consumer) reportDead(d inbox.DeadLetter) {
	inbox.ReportDeadLetter(c.cfg.Logger, c.cfg.OnDeadLetter, d) // it takes nil as slog.Default
}
