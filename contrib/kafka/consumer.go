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
// When the handler fails for a record, the consumer commits what came
// before it, seeks the partition back to the failed record, and waits
// [Config.RetryDelay] before the record is delivered again: a partition
// never skips a record it could not process. A member that stops polling
// for longer than the group's rebalance timeout (a hung handler) loses its
// partitions; the new owner redelivers from the last commit, possibly while
// the old member still runs its last record, and the inbox (or the stored
// offset's row lock) lets only one of them commit the effect.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/inbox"
)

// DefaultIDHeader is the record header that carries the message id unless
// [Config.IDHeader] names another.
const DefaultIDHeader = "message-id"

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

	// IDFromOffset, when the header is missing, makes the id
	// "topic/partition/offset" instead of leaving it empty. Such an id
	// dedups redeliveries of the record but not a producer's retries that
	// wrote it twice. [SQLOffsets] does not need ids at all.
	IDFromOffset bool

	// DeadLetter, when set, receives each record without an id (no header
	// and IDFromOffset false) instead of Handler; when it returns nil the
	// record is committed. When nil, such a record fails with
	// [inbox.ErrNoMessageID] like a handler error: it is not committed and
	// its partition retries it, stuck, until the producer is fixed and the
	// record dealt with by hand.
	DeadLetter inbox.Handler

	// Positions, when set, is consulted when partitions are assigned: the
	// consumer starts each partition at the offset it stores instead of the
	// group's committed offset. Set it to the [SQLOffsets] whose Handle
	// makes Handler.
	Positions PositionStore

	// RetryDelay is the wait before a record whose handler failed is
	// delivered again; zero means one second.
	RetryDelay time.Duration

	// MaxPollRecords bounds the records of one poll; zero means 500.
	MaxPollRecords int

	// OnError, when set, is told of errors the consumer handles by itself
	// and goes on after: handler failures (retried), failed offset commits
	// (the next commit covers them; until then a restart redelivers, which
	// the inbox absorbs) and fetch errors. Nil ignores them.
	OnError func(error)
}

// PositionStore keeps consumer groups' offsets outside Kafka, in the
// database of the effects. [SQLOffsets] is one.
type PositionStore interface {
	// Positions returns the next offset to consume of the partitions of
	// group it has stored; a partition it has none of is absent.
	Positions(ctx context.Context, group string, partitions map[string][]int32) (map[string]map[int32]int64, error)
}

// Consumer runs [Config.Handler] on the records of a consumer group. It is
// not safe for concurrent use: one goroutine calls [Consumer.Run], and
// then [Consumer.Close].
type Consumer struct {
	cl  *kgo.Client
	cfg Config
}

// NewConsumer returns a Consumer for cfg. opts configure the franz-go
// client (kgo.SeedBrokers at least; TLS, SASL, ...); NewConsumer adds the
// group, the topics, DisableAutoCommit and BlockRebalanceOnPoll, which the
// commit order depends on, so opts must not change those.
func NewConsumer(cfg Config, opts ...kgo.Opt) (*Consumer, error) {
	if cfg.Group == "" || len(cfg.Topics) == 0 || cfg.Handler == nil {
		return nil, errors.New("idemhttp/kafka: Config.Group, Config.Topics and Config.Handler are required")
	}
	if cfg.IDHeader == "" {
		cfg.IDHeader = DefaultIDHeader
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = time.Second
	}
	if cfg.MaxPollRecords <= 0 {
		cfg.MaxPollRecords = 500
	}
	c := &Consumer{cfg: cfg}
	all := append([]kgo.Opt{}, opts...)
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
	parts := make(map[string][]int32, len(assigned))
	for t, ps := range assigned {
		for p := range ps {
			parts[t] = append(parts[t], p)
		}
	}
	stored, err := c.cfg.Positions.Positions(ctx, c.cfg.Group, parts)
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

// Run polls and processes records until ctx ends or the client is closed,
// and returns ctx's error (or [kgo.ErrClientClosed]). Records of one
// partition are processed one at a time, in order; the offsets of a
// poll's processed records are committed before the next poll.
func (c *Consumer) Run(ctx context.Context) error {
	for {
		fetches := c.cl.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			return kgo.ErrClientClosed
		}
		if err := ctx.Err(); err != nil {
			c.cl.AllowRebalance()
			return err
		}
		failed := false
		fetches.EachError(func(t string, p int32, err error) {
			c.report(fmt.Errorf("idemhttp/kafka: fetch %s/%d: %w", t, p, err))
			failed = true // wait before polling again, not spin
		})
		var done []*kgo.Record
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			last, ok := c.processPartition(ctx, p.Records)
			if last != nil {
				done = append(done, last)
			}
			if !ok {
				failed = true
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
		if failed {
			t := time.NewTimer(c.cfg.RetryDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
	}
}

// processPartition runs the handler on rs in order and returns the last
// record it processed, and false when one failed: then the partition is
// seeked back to that record so that the next poll delivers it again.
func (c *Consumer) processPartition(ctx context.Context, rs []*kgo.Record) (*kgo.Record, bool) {
	var last *kgo.Record
	for _, r := range rs {
		m := c.message(r)
		var err error
		switch {
		case m.ID != "", c.cfg.Positions != nil && c.cfg.DeadLetter == nil:
			// With positions in the database, the offset is the id.
			err = c.cfg.Handler(ctx, m)
		case c.cfg.DeadLetter != nil:
			err = c.cfg.DeadLetter(ctx, m)
		default:
			err = inbox.ErrNoMessageID
		}
		if err != nil {
			c.report(fmt.Errorf("idemhttp/kafka: %s offset %d: not committed, will retry: %w", m.Source, r.Offset, err))
			c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{
				r.Topic: {r.Partition: {Epoch: r.LeaderEpoch, Offset: r.Offset}},
			})
			return last, false
		}
		last = r
	}
	return last, true
}

// message turns r into the Message handlers see.
func (c *Consumer) message(r *kgo.Record) *inbox.Message {
	m := &inbox.Message{
		Source: r.Topic + "/" + strconv.Itoa(int(r.Partition)),
		Body:   r.Value,
		Time:   r.Timestamp,
		Raw:    r,
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

// OffsetID is the id of a record by its position: "topic/partition/offset".
func OffsetID(r *kgo.Record) string {
	return r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
}

func (c *Consumer) report(err error) {
	if c.cfg.OnError != nil {
		c.cfg.OnError(err)
	}
}
