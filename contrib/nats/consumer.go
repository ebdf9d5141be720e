package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idemhttp/inbox"
)

// Defaults for the zero fields of [Consumer].
const (
	// DefaultIDHeader is the header the message id comes from by default:
	// the one JetStream itself deduplicates publishes by.
	DefaultIDHeader = "Nats-Msg-Id"
	// DefaultBatch is how many messages one pull asks for.
	DefaultBatch = 16
	// DefaultMaxWait is how long one pull waits for its batch to fill.
	DefaultMaxWait = 5 * time.Second
)

// ErrAckPolicy: the JetStream consumer does not use AckExplicit, so a
// failed message could not be redelivered. With AckNone (an ordered
// consumer, for one) the server counts a message as acknowledged when it
// sends it, and a nak is ignored; with AckAll, acking one message acks
// every earlier one, including messages whose handlers failed or still
// run. [Consumer.Run] refuses both before it pulls anything.
var ErrAckPolicy = errors.New("nats: the consumer's ack policy is not AckExplicit: a failed message would not be redelivered")

// NoIDPolicy says what [Consumer.Run] does with a message that carries no
// id. Neither choice acknowledges it: a message with no id cannot be
// deduplicated, so it is never passed to the handler, and never acked as
// if it had been processed.
type NoIDPolicy int

const (
	// NoIDTerm (the zero value) terminates the message (AckTerm) and
	// reports it ([Consumer.OnDeadLetter] and a log line): the server
	// never redelivers it and publishes a
	// $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED advisory naming its stream
	// sequence, from which a dead-letter process can fetch it. Run goes on
	// with the next message.
	NoIDTerm NoIDPolicy = iota
	// NoIDStop naks the message (it is redelivered) and stops Run with an
	// error wrapping [inbox.ErrNoMessageID] that names the stream and the
	// consumer: the line stops until a person looks.
	NoIDStop
)

// Consumer pulls messages from a JetStream consumer and passes each to an
// [inbox.Handler], acknowledging it only after the handler returned nil:
// when the handler runs its effect through the inbox, that is after the
// effect's transaction committed.
//
// The order that makes a crash safe, for every message:
//
//  1. the handler inserts the message id into the inbox and writes its
//     effect, in one transaction, and commits;
//  2. Run acks the message.
//
// A crash between 1 and 2 leaves the message unacknowledged: the server
// redelivers it once the consumer's AckWait has passed, to whichever
// client pulls next from the same durable consumer (this process after a
// restart, or another instance at once), and the inbox finds the id and
// runs nothing. The JetStream consumer must use AckExplicit (the default
// for pull consumers): Run refuses any other ack policy ([ErrAckPolicy]).
//
// The message id comes from the Nats-Msg-Id header by default, or from the
// header [Consumer.IDHeader] names. It is the producer's id, not the
// stream sequence: a stream sequence identifies one stored copy, so it
// is stable across redeliveries but differs between two publishes of the
// same message. A producer that publishes again when it is unsure whether
// its first publish landed (a lost PubAck) must send the same Nats-Msg-Id;
// JetStream then drops the second copy itself if it arrives within the
// stream's duplicate window (2 minutes by default), and the inbox dedups
// copies that arrive later or reach the stream by another route.
//
// The zero value is ready to use; a Consumer may be shared by several Run
// calls (it is only read).
type Consumer struct {
	// IDHeader names the header holding the message id. Empty means
	// [DefaultIDHeader].
	IDHeader string
	// IDSpace is the [inbox.Message.IDSpace] of the messages: the space in
	// which their ids are unique. Empty means the stream's name. Give the
	// consumers of several streams the same IDSpace to declare that their
	// ids are one space, which the inbox then dedups across them.
	IDSpace string
	// NoID says what to do with a message with no id. The zero value is
	// [NoIDTerm].
	NoID NoIDPolicy
	// Batch is how many messages one pull asks for. Zero means
	// [DefaultBatch]. Messages of a batch wait in this process while the
	// ones before them are handled, and their AckWait runs meanwhile:
	// keep Batch times the handler's usual duration well under AckWait,
	// or the server redelivers them elsewhere (harmless with the inbox,
	// but wasted work).
	Batch int
	// MaxWait bounds how long one pull waits for its batch to fill.
	// Zero means [DefaultMaxWait]. It does not delay Run's return when
	// ctx is done.
	MaxWait time.Duration
	// Retry says when a message whose handler returned an error is
	// redelivered (a nak with that delay: 1 s doubling to 5 min by
	// default), and after how many deliveries it is given up instead (5
	// by default): then Run terminates it (AckTerm; the server publishes
	// a MSG_TERMINATED advisory) and reports it. Deliveries are the
	// server's count (NumDelivered), across instances and restarts; a
	// message that arrives already past the limit (its earlier deliveries
	// never settled: the consumer crashed on them) is terminated without
	// running the handler. When the JetStream consumer's own MaxDeliver is
	// lower, the server stops at MaxDeliver, publishing a MAX_DELIVERIES
	// advisory, and Run reports that instead.
	Retry inbox.Retry
	// Heartbeat is how often Run tells the server a message is still
	// being handled (AckProgress), which restarts its AckWait, so a
	// handler slower than AckWait does not have its message redelivered
	// to another client while it runs. Zero means a third of the
	// consumer's AckWait; negative means never.
	Heartbeat time.Duration
	// ProcessingLimit bounds how long one message's handler runs. When it
	// passes, the handler's context ends (an inbox transaction rolls back,
	// see [inbox.SQL]), the heartbeats stop, and Run naks the message at
	// once, so that another client gets it, even if the handler goes on;
	// Run waits for the handler to return before it takes the next
	// message, and never acks the one it naked. Zero means
	// [inbox.DefaultProcessingLimit]; negative means no limit.
	ProcessingLimit time.Duration
	// OnDeadLetter, when set, is called (from Run's goroutine) for each
	// message Run gives up on: terminated after its last allowed delivery
	// failed, past the consumer's MaxDeliver, or without an id. Run also
	// logs each at level Error.
	OnDeadLetter func(inbox.DeadLetter)
	// Logger receives Run's log lines; nil means [slog.Default].
	Logger *slog.Logger
}

// Run pulls from cons until ctx is done or an error stops it, and passes
// each message to h, one at a time, in the order the server sent them.
//
// Before it pulls, Run checks that cons uses AckExplicit, and returns an
// error wrapping [ErrAckPolicy] when it does not (an ordered consumer, for
// one). After h returns nil, Run acks the message; after h returns an
// error, Run naks it with [Consumer.Retry]'s delay, or terminates it on
// its last delivery, and goes on: a handler error never stops Run. h gets
// a context that ends with ctx or at [Consumer.ProcessingLimit].
//
// Shutdown loses nothing: when ctx is done while h runs, Run waits for h,
// acks the message if h returned nil (its effect committed) and naks it,
// for redelivery at once, otherwise, whatever the settings. It naks the
// messages it had pulled and not handled, so the server can redeliver
// them before their AckWait ends, and returns ctx.Err(). (A consumer whose
// MaxDeliver is reached by such a delivery redelivers it no more: keep
// MaxDeliver unlimited, the default, or above Retry's MaxDeliveries.)
// Otherwise Run returns the pull's error (a closed connection;
// [jetstream.ErrConsumerDeleted] when the consumer is deleted during a
// pull), an error wrapping [jetstream.ErrConsumerNotFound] when it was
// deleted between pulls, or an error wrapping [inbox.ErrNoMessageID] (see
// [NoIDStop]). No goroutine of Run's outlives it.
func (c *Consumer) Run(ctx context.Context, cons jetstream.Consumer, h inbox.Handler) error {
	if h == nil {
		return errors.New("nats: nil handler")
	}
	info, err := cons.Info(ctx)
	switch {
	case errors.Is(err, jetstream.ErrOrderedConsumerNotCreated):
		// Only an ordered consumer has no info before its first pull.
		return fmt.Errorf("%w: an ordered consumer (AckNone)", ErrAckPolicy)
	case err != nil:
		return fmt.Errorf("nats: consumer info: %w", err)
	case info.Config.AckPolicy != jetstream.AckExplicitPolicy:
		return fmt.Errorf("%w: consumer %q of stream %q uses %v", ErrAckPolicy, info.Name, info.Stream, info.Config.AckPolicy)
	}
	r := &run{c: c, h: h, maxDeliver: info.Config.MaxDeliver, idHeader: c.IDHeader, batch: c.Batch, maxWait: c.MaxWait, heartbeat: c.Heartbeat}
	if r.idHeader == "" {
		r.idHeader = DefaultIDHeader
	}
	if r.batch <= 0 {
		r.batch = DefaultBatch
	}
	if r.maxWait <= 0 {
		r.maxWait = DefaultMaxWait
	}
	if r.heartbeat == 0 {
		r.heartbeat = defaultHeartbeat(info)
	}
	r.limit = c.ProcessingLimit
	if r.limit == 0 {
		r.limit = inbox.DefaultProcessingLimit
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.fetchAndHandle(ctx, cons); err != nil {
			return err
		}
	}
}

// run is one Run's settings, resolved.
type run struct {
	c          *Consumer
	h          inbox.Handler
	maxDeliver int // the JetStream consumer's; <= 0: none
	idHeader   string
	batch      int
	maxWait    time.Duration
	heartbeat  time.Duration
	limit      time.Duration // < 0: none
}

// fetchAndHandle pulls one batch and handles it.
func (r *run) fetchAndHandle(ctx context.Context, cons jetstream.Consumer) error {
	// The pull's deadline is its expiry on the server too (the library
	// refuses FetchMaxWait with FetchContext); cancelling ctx ends it.
	fctx, cancel := context.WithTimeout(ctx, r.maxWait)
	defer cancel()
	msgs, err := cons.Fetch(r.batch, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("nats: fetch: %w", err)
	}
	var stop error
	got := 0
	for msg := range msgs.Messages() {
		got++
		if stop != nil || ctx.Err() != nil {
			// Pulled but not handled: hand it back now rather than
			// after AckWait.
			_ = msg.Nak()
			continue
		}
		stop = r.handle(ctx, msg)
	}
	if stop != nil {
		return stop
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("nats: fetch: %w", err)
	}
	if got == 0 {
		// A pull from a consumer that no longer exists gets no answer at
		// all (the server only says so to a pull already waiting when
		// the consumer goes), so an empty pull asks whether it is still
		// there, once per MaxWait while the stream is idle.
		if _, err := cons.Info(ctx); errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("nats: %w", err)
		}
	}
	return nil
}

// handle runs h for one message and settles it. It returns an error only
// when Run must stop.
func (r *run) handle(ctx context.Context, msg jetstream.Msg) error {
	c := r.c
	id := msg.Headers().Get(r.idHeader)
	// Metadata parses the reply subject on every call: once per message.
	md, mdErr := msg.Metadata()
	if mdErr != nil {
		md = nil
	}
	m := newMessage(id, c.IDSpace, msg, md)
	n := 1
	if md != nil {
		n = int(min(md.NumDelivered, 1<<30))
	}
	if id == "" {
		if c.NoID == NoIDStop {
			if err := msg.Nak(); err != nil {
				return fmt.Errorf("nats: nak: %w", err)
			}
			return fmt.Errorf("nats: message on %q (%s): %w", msg.Subject(), m.Source, inbox.ErrNoMessageID)
		}
		if err := msg.Term(); err != nil {
			return fmt.Errorf("nats: term: %w", err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: inbox.ErrNoMessageID, To: terminated})
		return nil
	}
	if limit, ok := c.Retry.Limit(); ok && n > limit {
		// Delivered more often than allowed, its earlier deliveries never
		// settled: the consumer died on them. Running it again could kill
		// this one too.
		if err := msg.Term(); err != nil {
			return fmt.Errorf("nats: term: %w", err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: fmt.Errorf("delivered %d times, more than the %d allowed, without being settled", n, limit), To: terminated})
		return nil
	}
	released, err := r.callHandler(ctx, msg, m)
	if released {
		// Naked at the processing limit: whatever the handler did, the
		// server delivers the message again and the inbox serialises
		// the two.
		c.logger().Warn("nats: handler passed its processing limit; message naked",
			slog.String("source", m.Source), slog.String("id", id), slog.Bool("returned_nil", err == nil))
		return nil
	}
	if err == nil {
		// The effect committed. If this ack is lost (a crash now, a
		// dropped connection), the server redelivers after AckWait and
		// the inbox turns the message away.
		if err := msg.Ack(); err != nil {
			return fmt.Errorf("nats: ack: %w", err)
		}
		return nil
	}
	// The transaction rolled back, the inbox row with it, so the
	// redelivery runs the effect again.
	switch {
	case ctx.Err() != nil:
		// Shutdown: redelivered at once, to whoever pulls next, and never
		// terminated.
		err = msg.Nak()
	case r.maxDeliver > 0 && n >= r.maxDeliver:
		// The server redelivers it no more: it publishes a
		// MAX_DELIVERIES advisory when the nak comes.
		if nerr := msg.Nak(); nerr != nil {
			return fmt.Errorf("nats: nak: %w", nerr)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: err,
			To: fmt.Sprintf("the consumer's MaxDeliver (%d) reached: the server publishes $JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES", r.maxDeliver)})
		return nil
	case c.Retry.Exhausted(n):
		if terr := msg.Term(); terr != nil {
			return fmt.Errorf("nats: term: %w", terr)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: err, To: terminated})
		return nil
	default:
		err = msg.NakWithDelay(c.Retry.After(n))
	}
	if err != nil {
		return fmt.Errorf("nats: nak: %w", err)
	}
	return nil
}

// terminated says where a terminated message went.
const terminated = "terminated (AckTerm): the server publishes $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED with its stream sequence"

// callHandler runs h, telling the server every heartbeat that msg is
// still in progress, and returns h's error. When the processing limit
// passes first, the heartbeats stop, msg is naked for redelivery at once,
// and callHandler reports released (inbox.Supervise).
func (r *run) callHandler(ctx context.Context, msg jetstream.Msg, m *inbox.Message) (released bool, err error) {
	return inbox.Supervise(ctx, r.h, m, inbox.Supervision{
		Limit: r.limit,
		Every: r.heartbeat,
		// A lost heartbeat costs a redelivery, which the inbox turns
		// away: nothing to do about an error here.
		Beat: func() { _ = msg.InProgress() },
		// A lost nak: redelivered after AckWait, the heartbeats stopped.
		Release: func() { _ = msg.Nak() },
	})
}

// defaultHeartbeat is a third of the consumer's AckWait (JetStream's
// default AckWait, 30 s, when the consumer's info has none).
func defaultHeartbeat(info *jetstream.ConsumerInfo) time.Duration {
	ackWait := 30 * time.Second
	if info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait
	}
	return ackWait / 3
}

func (c *Consumer) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

func (c *Consumer) report(d inbox.DeadLetter) {
	inbox.ReportDeadLetter(c.Logger, c.OnDeadLetter, d) // it takes nil as slog.Default
}
