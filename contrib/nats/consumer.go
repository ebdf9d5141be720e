package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
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

// ErrMaxDeliver: the JetStream consumer has a MaxDeliver limit. The
// server counts every delivery toward it, those a shutdown or a message
// pulled ahead and handed back cost too, and past it stops delivering
// the message, healthy or not, with no more than an advisory: a message
// lost to the consumer. [Consumer.Run] refuses such a consumer before it
// pulls anything; the message core's own limit ([Consumer.Retry],
// counted by [Consumer.Ledger]) counts only the handler's failures.
var ErrMaxDeliver = errors.New("nats: the consumer has a MaxDeliver limit, which shutdowns count toward: a healthy message could stop being delivered")

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
	// Batch is how many messages one pull asks for, taken ahead of the
	// handler.
	// Zero means [DefaultBatch]. Messages pulled ahead wait in this
	// process while the ones before them are handled, and their AckWait
	// runs meanwhile: keep Batch times the handler's usual duration well
	// under AckWait, or the server redelivers them elsewhere (harmless with
	// the inbox, but wasted work). At shutdown they are naked at once.
	Batch int
	// MaxWait is the expiry of one pull on the server, at least 1 s; after
	// MaxWait with nothing to handle Run asks whether its consumer still
	// exists. Zero means [DefaultMaxWait]. At shutdown Run waits for the
	// pull in progress to end, at most MaxWait (no wait when its batch is
	// full), so that every message the server sent for it is naked: keep
	// it well under the shutdown's grace period.
	MaxWait time.Duration
	// Retry says when a message whose handler failed is redelivered (a
	// nak with that delay: 1 s doubling to 5 min by default), and after
	// how many failed runs it is given up instead (5 by default): then Run
	// terminates it (AckTerm; the server publishes a MSG_TERMINATED
	// advisory) and reports it. A message whose runs already failed as
	// often as allowed (some of them by killing their process) is
	// terminated on arrival without running.
	//
	// Failed runs are counted by [Consumer.Ledger], never by the server's
	// NumDelivered, which also counts the naks of shutdowns and of
	// messages pulled ahead and handed back. For the same reason Run
	// refuses a consumer with a MaxDeliver limit ([ErrMaxDeliver]).
	Retry inbox.Retry
	// Ledger counts each message's failed handler runs, and the runs its
	// process died in, for every instance and restart: give it the
	// inbox's (inbox.SQL.Ledger, contrib/postgres's Inbox.Ledger) with
	// the consumer name of the handler's inbox. Nil means a count of this
	// Run's own ([inbox.MemoryLedger]): a poison message then gets up to
	// Retry.MaxDeliveries failures per Run that meets it, and a message
	// that kills its process is never counted.
	Ledger inbox.Ledger
	// Heartbeat is how often Run tells the server a message is still
	// being handled (AckProgress), which restarts its AckWait, so a
	// handler slower than AckWait does not have its message redelivered
	// to another client while it runs. Zero means a third of the
	// consumer's AckWait; negative means never.
	Heartbeat time.Duration
	// ProcessingLimit bounds how long one message's handler runs. When it
	// passes, the handler's context ends (an inbox transaction rolls back,
	// see [inbox.SQL]), the heartbeats stop, the failure is counted, and
	// Run naks the message at once, so that another client gets it, even
	// if the handler goes on; Run waits for the handler to return before
	// it takes the next message, and never acks the one it naked. Zero
	// means [inbox.DefaultProcessingLimit]; negative means no limit.
	ProcessingLimit time.Duration
	// OnDeadLetter, when set, is called (from Run's goroutine) for each
	// message Run gives up on: terminated after its last allowed failure,
	// or without an id. Run also logs each at level Error.
	OnDeadLetter func(inbox.DeadLetter)
	// Logger receives Run's log lines; nil means [slog.Default].
	Logger *slog.Logger
}

// Run pulls from cons until ctx is done or an error stops it, and passes
// each message to h, one at a time, in the order the server sent them.
//
// Before it pulls, Run checks that cons uses AckExplicit and has no
// MaxDeliver limit, and returns an error wrapping [ErrAckPolicy] or
// [ErrMaxDeliver] when it does not. Each message goes through the message
// core ([inbox.Runner]), which decides from [Consumer.Ledger]; Run maps
// its decisions onto JetStream's verbs. After h returns nil, Run acks the
// message; after h returns an error, Run naks it with [Consumer.Retry]'s
// delay, or terminates it on its last allowed failure, and goes on: a
// handler error never stops Run. h gets a context that ends with ctx or
// at [Consumer.ProcessingLimit].
//
// Shutdown loses nothing and counts nothing: when ctx is done while h
// runs, Run waits for h, acks the message if h returned nil (its effect
// committed) and naks it, for redelivery at once, otherwise, whatever the
// settings. Then it waits for the pull in progress to end (at most
// [Consumer.MaxWait]) and naks every message the server sent for it that
// h did not get, so that the next client gets them at once, not after
// AckWait, and returns ctx.Err(). Otherwise Run returns the
// pull's error (a closed connection; [jetstream.ErrConsumerDeleted] when
// the consumer is deleted during a pull), an error wrapping
// [jetstream.ErrConsumerNotFound] when it was deleted between pulls, or
// an error wrapping [inbox.ErrNoMessageID] (see [NoIDStop]). No goroutine
// of Run's outlives it.
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
	if info.Config.MaxDeliver > 0 {
		return fmt.Errorf("%w: consumer %q of stream %q has MaxDeliver %d", ErrMaxDeliver, info.Name, info.Stream, info.Config.MaxDeliver)
	}
	r := &run{c: c, idHeader: c.IDHeader, batch: c.Batch, maxWait: c.MaxWait}
	if r.idHeader == "" {
		r.idHeader = DefaultIDHeader
	}
	if r.batch <= 0 {
		r.batch = DefaultBatch
	}
	if r.maxWait <= 0 {
		r.maxWait = DefaultMaxWait
	}
	r.maxWait = max(r.maxWait, time.Second) // the server's least pull expiry
	heartbeat := c.Heartbeat
	if heartbeat == 0 {
		heartbeat = defaultHeartbeat(info)
	}
	limit := c.ProcessingLimit
	if limit == 0 {
		limit = inbox.DefaultProcessingLimit
	}
	p := inbox.Policy{Retry: c.Retry}
	if c.NoID == NoIDStop {
		p.NoID = inbox.NoIDStop
	}
	r.runner = &inbox.Runner{Policy: p, Ledger: c.Ledger, Handler: h, Limit: limit, Every: heartbeat}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.pullAndHandle(ctx, cons); err != nil {
			return err
		}
	}
}

// run is one Run's settings, resolved, and the messages of the pull in
// progress that go back once it has ended.
type run struct {
	c         *Consumer
	runner    *inbox.Runner
	idHeader  string
	batch     int
	maxWait   time.Duration
	returning []jetstream.Msg
	// pulled is the pull in progress's channel: at the processing limit,
	// the release drains it (the loop waits meanwhile).
	pulled <-chan jetstream.Msg
}

// pullAndHandle pulls one batch and handles it. Once ctx is done, or a
// message stops Run, the rest of the batch is not handled but kept, and
// so is the message whose handler a shutdown interrupted: they are naked
// when the pull has ended on the server (its batch full, or its expiry,
// MaxWait), every message the server sent for it received. Naked before,
// one could be redelivered into this very pull and be dropped with it,
// to wait for AckWait; and a pull whose context ended with Run's, as
// before, dropped the messages the server had sent and the client not
// yet handed over. The pull is therefore not bound to ctx: Run's return
// waits for it, at most MaxWait.
func (r *run) pullAndHandle(ctx context.Context, cons jetstream.Consumer) error {
	msgs, err := cons.Fetch(r.batch, jetstream.FetchMaxWait(r.maxWait))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("nats: fetch: %w", err)
	}
	r.pulled = msgs.Messages()
	defer func() { r.pulled = nil }()
	var stop error
	got := 0
	for msg := range msgs.Messages() {
		got++
		if stop != nil || ctx.Err() != nil {
			// Pulled but not handled: back once the pull has ended.
			r.returning = append(r.returning, msg)
			continue
		}
		stop = r.handle(ctx, msg, false)
	}
	// The pull has ended: nothing more comes for it.
	for _, msg := range r.returning {
		r.handBack(msg)
	}
	r.returning = nil
	if stop != nil {
		return stop
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := msgs.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
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

// releaseRest hands back, at the processing limit, the messages of the
// pull in progress that the hung handler's message had ahead of it, so
// that a healthy one is not held until AckWait behind it: it takes them
// all, to the pull's end (at most MaxWait), then naks them. It runs on
// the release's goroutine while the loop waits for the handler.
func (r *run) releaseRest() {
	if r.pulled == nil {
		return
	}
	var rest []jetstream.Msg
	for msg := range r.pulled {
		rest = append(rest, msg)
	}
	for _, msg := range rest {
		r.handBack(msg)
	}
}

// handBack hands msg, pulled ahead of the handler, back unrun.
func (r *run) handBack(msg jetstream.Msg) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = r.handle(ctx, msg, true)
}

// handle runs msg through the message core (inbox.Runner) and maps its
// decision onto JetStream's verbs: ack, nak (with the delay), term. It
// returns an error only when Run must stop. stopping hands msg back
// unrun.
func (r *run) handle(ctx context.Context, msg jetstream.Msg, stopping bool) error {
	c := r.c
	id := msg.Headers().Get(r.idHeader)
	// Metadata parses the reply subject on every call: once per message.
	md, mdErr := msg.Metadata()
	if mdErr != nil {
		md = nil
	}
	m := newMessage(id, c.IDSpace, msg, md)
	// NumDelivered only says whether the run is worth a durable marker:
	// the core decides from the ledger, never from the server's count,
	// which also counts the naks of shutdowns and of messages pulled
	// ahead and handed back.
	arrival := inbox.Arrival{HasID: id != "", Stopping: stopping || ctx.Err() != nil, MaybeRedelivered: md == nil || md.NumDelivered > 1}
	dec, state := r.runner.Deliver(ctx, m, inbox.Key{IDSpace: m.IDSpace, ID: id}, arrival, inbox.Hooks{
		// A lost heartbeat costs a redelivery, which the inbox turns
		// away: nothing to do about an error here.
		Beat: func() { _ = msg.InProgress() },
		// A lost nak: redelivered after AckWait, the heartbeats stopped.
		Release: func() {
			_ = msg.Nak()
			r.releaseRest()
		},
	})
	switch dec.Verb {
	case inbox.VerbAck:
		// The effect committed (or the message was done before). If this
		// ack is lost (a crash now, a dropped connection), the server
		// redelivers after AckWait and the inbox turns the message away.
		if err := msg.Ack(); err != nil {
			return fmt.Errorf("nats: ack: %w", err)
		}
		return nil
	case inbox.VerbRequeue:
		if dec.Report {
			c.report(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: holding})
		}
		switch {
		case arrival.Stopping:
			// Handed back once its pull ended: best effort, AckWait
			// covers a lost nak.
			_ = msg.Nak()
			return nil
		case ctx.Err() != nil:
			// A shutdown interrupted its handler: naked once its pull has
			// ended (pullAndHandle).
			r.returning = append(r.returning, msg)
			return nil
		case dec.Delay > 0:
			if err := msg.NakWithDelay(dec.Delay); err != nil {
				return fmt.Errorf("nats: nak: %w", err)
			}
		default:
			if err := msg.Nak(); err != nil {
				return fmt.Errorf("nats: nak: %w", err)
			}
		}
		return nil
	case inbox.VerbDeadLetter:
		// The core forgets the message's record only once the term is
		// done: a term that fails leaves the count, and the server's
		// redelivery (after AckWait) is dead-lettered on arrival, unrun.
		err := msg.Term()
		r.runner.DeadLettered(ctx, state, inbox.Key{IDSpace: m.IDSpace, ID: id}, err)
		if err != nil {
			return fmt.Errorf("nats: term: %w", err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: terminated})
		return nil
	case inbox.VerbStop:
		// Naked once its pull has ended, so that it does not come
		// straight back into it.
		r.returning = append(r.returning, msg)
		return fmt.Errorf("nats: message on %q (%s): %w", msg.Subject(), m.Source, dec.Err)
	}
	if state.State() == inbox.StateReleased {
		// Naked at the processing limit: whatever the handler did, the
		// server delivers the message again and the inbox serialises
		// the two.
		c.logger().Warn("nats: handler passed its processing limit; message naked",
			slog.String("source", m.Source), slog.String("id", id))
		return nil
	}
	// No decision (a refused move: a bug): back at once, never acked.
	_ = msg.Nak()
	return dec.Err
}

// holding says where a message with no delivery limit is while it fails.
const holding = "naked with its delay: no delivery limit (Retry.MaxDeliveries < 0), it comes back until it succeeds"

// terminated says where a terminated message went.
const terminated = "terminated (AckTerm): the server publishes $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED with its stream sequence"

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
