package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idemhttp/inbox"
)

// DefaultPrefetch is the QoS prefetch count [Consumer.Run] asks for when
// [Consumer.Prefetch] is zero.
const DefaultPrefetch = 32

// Errors [Consumer.Run] returns, wrapped with the details; test them with
// [errors.Is].
var (
	// ErrChannelClosed: the channel or its connection closed (a network
	// failure, a broker restart, a channel exception). Every delivery Run
	// had not acknowledged goes back to the queue; open a new channel and
	// call Run again.
	ErrChannelClosed = errors.New("rabbitmq: channel closed")
	// ErrConsumerCancelled: the broker cancelled the consumer (the queue
	// was deleted, or a node holding it went away) while the channel stayed
	// open.
	ErrConsumerCancelled = errors.New("rabbitmq: consumer cancelled by the broker")
)

// NoIDPolicy says what [Consumer.Run] does with a delivery that carries no
// message id. Neither choice acknowledges it: a message with no id cannot
// be deduplicated, so it is never passed to the handler, and never
// silently dropped as if it had been processed.
type NoIDPolicy int

const (
	// NoIDReject (the zero value) rejects the delivery without requeueing
	// it, and reports it ([Consumer.OnDeadLetter] and a log line).
	// RabbitMQ dead-letters a rejected message to the queue's dead-letter
	// exchange (the x-dead-letter-exchange queue argument or policy), with
	// an x-death header saying why; declare one, or the broker discards
	// the message. Run goes on with the next delivery.
	NoIDReject NoIDPolicy = iota
	// NoIDStop returns the delivery to the queue (nack with requeue) and
	// stops Run with an error wrapping [inbox.ErrNoMessageID] that names
	// the queue: the line stops until a person looks. Every consumer of
	// the queue stops the same way when the message reaches it.
	NoIDStop
)

// Consumer consumes one RabbitMQ queue with manual acknowledgements and
// passes every delivery to an [inbox.Handler], acknowledging it only after
// the handler returned nil: when the handler runs its effect through the
// inbox, that is after the effect's transaction committed.
//
// The order that makes a crash safe, for every delivery:
//
//  1. the handler inserts the message id into the inbox and writes its
//     effect, in one transaction, and commits;
//  2. Run acknowledges the delivery (basic.ack).
//
// A crash between 1 and 2 leaves the delivery unacknowledged, so RabbitMQ
// delivers it again, to this consumer when it comes back or to another
// consumer of the queue at once (the broker requeues every unacknowledged
// delivery of a closed channel, with the redelivered flag set): the
// inbox finds the id and runs nothing, and the delivery is acknowledged.
// A crash before 1 commits leaves nothing behind: the redelivery runs
// the effect for the first time. This is why the id must be stable
// across deliveries, and why dedup cannot be left to the redelivered flag
// (it is set for every delivery after a requeue, processed or not, and
// never for a producer's second publish of the same message).
//
// The message id comes from the AMQP message-id property, or from the
// header [Consumer.IDHeader] names. RabbitMQ assigns no id of its own: the
// producer must set one, and must set the same one when it publishes
// again a message whose publish it is unsure of (a publisher confirm that
// never came, a connection lost mid-publish), so that the inbox can
// recognise its second copy too. An id minted per publish attempt would
// dedup broker redeliveries only, never the producer's own retries.
//
// The zero value, with Queue set, is ready to use; a Consumer may be
// shared by several Run calls on different channels (it is only read).
type Consumer struct {
	// Queue is the queue to consume. Required.
	Queue string
	// Tag is the consumer tag of Run's first subscription. Run subscribes
	// again, under a unique tag, after it holds a failed delivery (see
	// Retry) or hands a delivery back at the processing limit. Empty
	// means a unique tag from the start.
	Tag string
	// Prefetch is the channel's QoS prefetch count: how many
	// unacknowledged deliveries the broker sends ahead of the handler.
	// Zero means [DefaultPrefetch]; AMQP's own zero ("unlimited") is not
	// offered, as it lets one consumer take a whole backlog that other
	// consumers could be working on. A delivery waiting out its retry
	// delay does not count against it (see Retry), up to Prefetch (at
	// least DefaultPrefetch) such deliveries.
	Prefetch int
	// IDHeader names the header that holds the message id (a string or
	// bytes value). Empty means the message-id property.
	IDHeader string
	// IDSpace is the [inbox.Message.IDSpace] of the deliveries: the space
	// in which their ids are unique. Empty means the queue's name. Give
	// the consumers of several queues the same IDSpace to declare that
	// their ids are one space (copies of the same messages), which the
	// inbox then dedups across them.
	IDSpace string
	// NoID says what to do with a delivery that has no id. The zero value
	// is [NoIDReject].
	NoID NoIDPolicy
	// Retry says when a delivery whose handler failed comes back, and
	// after how many failed runs it is dead-lettered instead. The zero
	// value is [inbox.Retry]'s default: 1 s doubling to 5 min, 5 runs.
	// RabbitMQ has no delayed requeue: Run holds the failed delivery,
	// unacknowledged, for the delay, then requeues it (nack), and goes on
	// with other deliveries meanwhile, as many as Prefetch allows: to keep
	// the held delivery from taking a prefetch slot, Run moves to a new
	// subscription (see Held deliveries and the prefetch in the package
	// documentation). Past Prefetch (at least DefaultPrefetch) held
	// deliveries, a failed one keeps its slot for its delay, with a
	// warning. On the last allowed failure Run rejects the delivery
	// without requeue, which dead-letters it to the queue's dead-letter
	// exchange (declare one: x-dead-letter-exchange), and reports it
	// ([Consumer.OnDeadLetter] and a log line).
	//
	// Failed runs are counted by [Consumer.Ledger], never by the queue: a
	// quorum queue's x-delivery-count also counts the deliveries that a
	// shutdown, a prefetch handed back or another message's processing
	// limit returned, which say nothing of this one, so Run does not read
	// it. A quorum queue's own delivery-limit (RabbitMQ 4 sets 20 by
	// default) counts them too and dead-letters, or drops, a healthy
	// message that met that many of them: set it to -1 (policy
	// delivery-limit), or well above Retry.MaxDeliveries plus the
	// restarts a message may see.
	Retry inbox.Retry
	// Ledger counts each message's failed handler runs, and the runs its
	// process died in, for every instance and restart: give it the
	// inbox's (inbox.SQL.Ledger, contrib/postgres's Inbox.Ledger) with
	// the consumer name of the handler's inbox. Nil means a count of this
	// Run's own ([inbox.MemoryLedger]): a poison message then gets up to
	// Retry.MaxDeliveries failures per Run that meets it, and a message
	// that kills its process is never counted (see Poison messages in the
	// package documentation).
	Ledger inbox.Ledger
	// ProcessingLimit bounds how long one delivery's handler runs. When it
	// passes, the handler's context ends (an inbox transaction rolls back,
	// see [inbox.SQL]), the failure is counted, and Run requeues the
	// delivery at once, with every delivery the broker had sent ahead of
	// it (those are not counted), so that other consumers get them, even
	// if the handler goes on; Run waits for the handler to return before
	// it takes the next delivery, and never acknowledges the requeued one.
	// Zero means [inbox.DefaultProcessingLimit]; negative means no limit
	// (RabbitMQ's consumer_timeout, 30 minutes by default, then closes
	// the channel).
	ProcessingLimit time.Duration
	// OnDeadLetter, when set, is called (from Run's goroutine) for each
	// delivery Run dead-letters: one whose last allowed delivery failed,
	// or that has no id. Run also logs each at level Error.
	OnDeadLetter func(inbox.DeadLetter)
	// Logger receives Run's log lines; nil means [slog.Default].
	Logger *slog.Logger
}

// Run consumes c.Queue on ch until ctx is done, the channel closes, or a
// delivery with no id stops it (see [NoIDStop]), and passes each delivery
// to h, one at a time, in the order the broker sent them.
//
// Each delivery goes through the message core ([inbox.Runner]), which
// decides from [Consumer.Ledger]; Run only maps its decisions onto the
// channel. After h returns nil, Run acknowledges the delivery. After h
// returns an error, Run requeues it after [Consumer.Retry]'s delay, or
// dead-letters it on its last allowed failure, and goes on: a handler
// error never stops Run. A delivery whose earlier runs already failed as
// often as allowed (some of them by killing their process) is
// dead-lettered on arrival without running. h gets a context that ends
// with ctx or at [Consumer.ProcessingLimit].
//
// Shutdown loses nothing and counts nothing: when ctx is done while h
// runs, Run waits for h, acknowledges the delivery if h returned nil (its
// effect committed) and requeues it otherwise, whatever the settings
// (never a reject, never a dead letter, never a failure in the ledger).
// Then it cancels its consumer, returns every delivery the broker had
// sent ahead, and every delivery waiting out a retry delay, to the queue
// (nack with requeue), and returns ctx.Err(). Otherwise it
// returns an error wrapping [ErrChannelClosed], [ErrConsumerCancelled] or
// [inbox.ErrNoMessageID]; a failed ack, nack or reject ends Run too, as it
// means the channel is gone. Run sets the channel's QoS, registers one
// consumer at a time on it (it subscribes again after holding a failed
// delivery or passing the processing limit), uses the channel alone while
// it runs, and does not close it. No goroutine of Run's outlives it.
//
// Use a connection without the client library's automatic recovery
// ([amqp.Config].Recovery nil, the default): a recovered channel numbers
// deliveries afresh, so an acknowledgement of a delivery from before the
// recovery could acknowledge another message, one never processed.
// Reconnect yourself and call Run again.
func (c *Consumer) Run(ctx context.Context, ch *amqp.Channel, h inbox.Handler) error {
	if c.Queue == "" {
		return errors.New("rabbitmq: Consumer.Queue is empty")
	}
	if h == nil {
		return errors.New("rabbitmq: nil handler")
	}
	prefetch := c.Prefetch
	if prefetch <= 0 {
		prefetch = DefaultPrefetch
	}
	// Register for the close before anything that can close the channel,
	// so that no close goes unseen. The library closes closed when the
	// channel closes (and sends the error first when the broker or the
	// network closed it).
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fmt.Errorf("rabbitmq: set prefetch: %w", closeErr(closed, err))
	}
	r := &run{c: c, ch: ch, runner: c.runner(h), maxHeld: max(prefetch, DefaultPrefetch)}
	defer r.stopTimer()
	if err := r.subscribe(); err != nil {
		return fmt.Errorf("rabbitmq: consume %q: %w", c.Queue, closeErr(closed, err))
	}
	for {
		select {
		case <-ctx.Done():
			return r.stop(ctx.Err())
		case e := <-closed:
			return closedBy(e)
		case <-r.timerC():
			if err := r.requeueDue(); err != nil {
				return err
			}
		case d, ok := <-r.deliveries:
			if !ok {
				// The delivery channel also closes when the channel does;
				// tell the two apart.
				select {
				case e := <-closed:
					return closedBy(e)
				default:
				}
				if ch.IsClosed() {
					return ErrChannelClosed
				}
				if r.cancelled {
					// Run cancelled it to hold a delivery outside the
					// prefetch (see hold), and has handled all it had
					// sent ahead: take deliveries again.
					if err := r.subscribe(); err != nil {
						return fmt.Errorf("rabbitmq: consume %q again: %w", c.Queue, closeErr(closed, err))
					}
					continue
				}
				return fmt.Errorf("%w (queue %q)", ErrConsumerCancelled, c.Queue)
			}
			// When select chose this case over a done ctx, the core hands
			// the delivery back unrun.
			err := r.handle(ctx, &d)
			if errors.Is(err, inbox.ErrNoMessageID) {
				// Leave the channel as the caller gave it: the
				// deliveries sent ahead go back now, not at close.
				return r.stop(err)
			}
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return r.stop(ctx.Err())
			}
			if r.released {
				// The processing limit cancelled the subscription (see
				// release); take deliveries again.
				if err := r.subscribe(); err != nil {
					return fmt.Errorf("rabbitmq: consume %q again: %w", c.Queue, closeErr(closed, err))
				}
			}
		}
	}
}

// run is the state of one Run: its subscription, the deliveries waiting
// out a retry delay, and those to requeue at the end.
type run struct {
	c       *Consumer
	ch      *amqp.Channel
	runner  *inbox.Runner
	maxHeld int // the held deliveries whose slots Run frees (see hold)

	tag        string               // of the current subscription
	deliveries <-chan amqp.Delivery // of the current subscription
	released   bool                 // the last handler passed its limit: the subscription is cancelled
	cancelled  bool                 // the subscription is cancelled to free a held delivery's slot

	returning []*amqp.Delivery // to requeue once the subscription is cancelled
	parked    []parked
	timer     *time.Timer
}

// parked is a failed delivery held until its retry delay has passed.
type parked struct {
	d   *amqp.Delivery
	due time.Time
}

// subscribe registers a consumer on the channel with a new tag. Not
// ConsumeWithContext: its context would cancel the consumer from a
// goroutine of the library's at any moment; Run cancels it itself, at a
// point where it can account for every delivery sent ahead.
func (r *run) subscribe() error {
	r.tag = r.c.Tag
	if r.tag == "" || r.released || r.cancelled {
		// A tag of its own for a second subscription: a quorum queue
		// keeps a cancelled consumer, under its tag, for as long as
		// deliveries it sent are unacknowledged (the held ones), and a
		// consumer of the same tag would take it over, with those
		// deliveries counted against its prefetch.
		r.tag = uniqueTag()
	}
	r.released, r.cancelled = false, false
	d, err := r.ch.Consume(r.c.Queue, r.tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	r.deliveries = d
	return nil
}

// handle runs one delivery through the message core (inbox.Runner) and
// maps its decision onto the channel: ack, a requeue (at once, or held
// for the delay and then requeued), a reject to the dead-letter exchange.
// It returns an error only when Run must stop.
func (r *run) handle(ctx context.Context, d *amqp.Delivery) error {
	c := r.c
	id, ok := c.messageID(d)
	m := newMessage(c.Queue, c.idSpace(), id, d)
	// The redelivered flag only says whether this run is worth a durable
	// marker: the core decides from the ledger, never from a count of the
	// broker's (a quorum queue's x-delivery-count also counts the
	// returns of shutdowns, prefetches and a neighbour's limit).
	arrival := inbox.Arrival{HasID: ok, Stopping: ctx.Err() != nil, MaybeRedelivered: d.Redelivered}
	dec, state := r.runner.Deliver(ctx, m, inbox.Key{IDSpace: m.IDSpace, ID: id}, arrival, inbox.Hooks{Release: func() { r.release(d) }})
	switch dec.Verb {
	case inbox.VerbAck:
		// The effect committed (or the message was done before). If this
		// ack is lost (a crash now, a dropped connection), the broker
		// delivers the message again and the inbox turns it away.
		if err := d.Ack(false); err != nil {
			return channelClosed(err)
		}
		return nil
	case inbox.VerbRequeue:
		if dec.Report {
			c.report(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: holding})
		}
		if dec.Delay <= 0 || ctx.Err() != nil {
			// Back at once: stop requeues it once the subscription is
			// cancelled, so that it does not come straight back here.
			r.returning = append(r.returning, d)
			return nil
		}
		return r.hold(d, time.Now().Add(dec.Delay))
	case inbox.VerbDeadLetter:
		// The core forgets the message's record only once the reject is
		// done: one on a channel that just closed leaves the count, and
		// the broker's redelivery is dead-lettered on arrival, unrun.
		err := d.Reject(false)
		r.runner.DeadLettered(ctx, state, inbox.Key{IDSpace: m.IDSpace, ID: id}, err)
		if err != nil {
			return channelClosed(err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: c.deadLetterTo()})
		return nil
	case inbox.VerbStop:
		r.returning = append(r.returning, d)
		return fmt.Errorf("rabbitmq: delivery %d on queue %q: %w", d.DeliveryTag, c.Queue, dec.Err)
	}
	if state.State() == inbox.StateReleased {
		// Requeued at the processing limit: the delivery tag is spent.
		// Whatever the handler did, the broker delivers the message again
		// and the inbox serialises the two.
		r.released = true
		c.logger().Warn("rabbitmq: handler passed its processing limit; delivery requeued",
			slog.String("queue", c.Queue), slog.String("id", id))
		return nil
	}
	// No decision (a refused move: a bug): back to the queue, never acked.
	r.returning = append(r.returning, d)
	return dec.Err
}

// holding says where a message with no delivery limit is while it fails.
const holding = "requeued after its delay: no delivery limit (Retry.MaxDeliveries < 0), it holds up its queue"

// release hands d back at the processing limit, with every delivery sent
// ahead of it: it cancels the subscription (so that the broker sends this
// stuck consumer nothing more) and requeues them, so that other consumers
// get them. The deliveries sent ahead never ran: nothing is counted for
// them, whatever the queue counts.
func (r *run) release(d *amqp.Delivery) {
	// Failures mean the channel is gone, and its deliveries with it.
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return
	}
	_ = d.Nack(false, true)
	for ahead := range r.deliveries {
		_ = ahead.Nack(false, true)
	}
}

// hold keeps d, unacknowledged, until due, without letting it take the
// slot of a delivery Run could handle meanwhile.
//
// The broker counts an unacknowledged delivery against the prefetch of
// the subscription it came from until it is settled, so a held one takes
// a slot: with Prefetch 1, or as many failing messages as the prefetch,
// nothing more came while they were held, and a classic queue put a
// requeued one back at its head, to be delivered again at once, so the
// messages behind it waited for as long as it failed. Raising the
// channel's QoS instead does not work: RabbitMQ applies a per-consumer
// prefetch (basic.qos without global) to the consumers subscribed after
// it only, and quorum queues refuse a consumer on a channel with a
// global one. So hold cancels the subscription: Run handles the
// deliveries it had sent ahead (none is handed back, which a quorum queue
// would count), then subscribes again, with a prefetch of its own that no
// held delivery takes. The held one is settled later on the same channel
// (requeued when due, or at shutdown), as any delivery of a cancelled
// consumer may be.
//
// Held deliveries are bounded: hold frees the slots of at most r.maxHeld
// of them (Prefetch, and at least DefaultPrefetch). A delivery that fails
// while more are held stays in a slot of the current subscription, which
// then takes one delivery fewer ahead: a flood of failing messages stops
// the consumer only when they fill the subscription's slots too, until
// the earliest delay ends. So Run never has more than maxHeld plus twice
// the prefetch deliveries unacknowledged (those that fail while a
// cancelled subscription's deliveries are handled are held outside it
// too).
func (r *run) hold(d *amqp.Delivery, due time.Time) error {
	r.parked = append(r.parked, parked{d: d, due: due})
	r.resetTimer()
	if r.cancelled {
		// d came from the cancelled subscription: it takes no slot of a
		// live one.
		return nil
	}
	if len(r.parked) > r.maxHeld {
		r.c.logger().Warn("rabbitmq: more failed deliveries held than Run keeps outside its prefetch; this one takes a slot until its delay ends",
			slog.String("queue", r.c.Queue), slog.Int("held", len(r.parked)), slog.Int("max_held", r.maxHeld))
		return nil
	}
	if err := r.ch.Cancel(r.tag, false); err != nil {
		return channelClosed(err)
	}
	r.cancelled = true
	return nil
}

// requeueDue requeues the parked deliveries whose delay has passed.
func (r *run) requeueDue() error {
	now := time.Now()
	keep := r.parked[:0]
	var err error
	for _, p := range r.parked {
		if err == nil && !p.due.After(now) {
			if nerr := p.d.Nack(false, true); nerr != nil {
				err = channelClosed(nerr)
			}
			continue
		}
		keep = append(keep, p)
	}
	clear(r.parked[len(keep):])
	r.parked = keep
	r.timer = nil
	r.resetTimer()
	return err
}

// resetTimer arms the timer for the earliest parked delivery.
func (r *run) resetTimer() {
	if len(r.parked) == 0 {
		r.stopTimer()
		return
	}
	due := r.parked[0].due
	for _, p := range r.parked[1:] {
		if p.due.Before(due) {
			due = p.due
		}
	}
	r.stopTimer()
	r.timer = time.NewTimer(time.Until(due))
}

func (r *run) stopTimer() {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}

// timerC is the timer's channel, or nil (never ready) when none is armed.
func (r *run) timerC() <-chan time.Time {
	if r.timer == nil {
		return nil
	}
	return r.timer.C
}

// stop cancels the subscription, requeues the deliveries to return, the
// parked ones and those sent ahead of the handler, and returns ret.
// Cancelling first keeps the broker from handing the requeued deliveries
// straight back to this consumer (and a quorum queue from counting them
// twice). The library delivers what it had buffered before it closes
// deliveries, once the broker confirmed the cancel.
func (r *run) stop(ret error) error {
	r.stopTimer()
	if err := r.ch.Cancel(r.tag, false); err != nil {
		// The channel is gone, and its deliveries went back with it.
		return ret
	}
	for _, d := range r.returning {
		if err := d.Nack(false, true); err != nil {
			return ret
		}
	}
	for _, p := range r.parked {
		if err := p.d.Nack(false, true); err != nil {
			return ret
		}
	}
	r.returning, r.parked = nil, nil
	for d := range r.deliveries {
		if err := d.Nack(false, true); err != nil {
			// Channel gone: the broker requeues the rest itself.
			break
		}
	}
	return ret
}

// runner is the message core's shell for one Run with handler h.
func (c *Consumer) runner(h inbox.Handler) *inbox.Runner {
	limit := c.ProcessingLimit
	if limit == 0 {
		limit = inbox.DefaultProcessingLimit
	}
	p := inbox.Policy{Retry: c.Retry}
	if c.NoID == NoIDStop {
		p.NoID = inbox.NoIDStop
	}
	return &inbox.Runner{Policy: p, Ledger: c.Ledger, Handler: h, Limit: limit}
}

// messageID returns the delivery's id from the configured place; ok is
// false when it has none (absent, empty, or a header of another type).
func (c *Consumer) messageID(d *amqp.Delivery) (string, bool) {
	if c.IDHeader == "" {
		return d.MessageId, d.MessageId != ""
	}
	var id string
	switch v := d.Headers[c.IDHeader].(type) {
	case string:
		id = v
	case []byte:
		id = string(v)
	}
	return id, id != ""
}

func (c *Consumer) idSpace() string {
	if c.IDSpace != "" {
		return c.IDSpace
	}
	return c.Queue
}

func (c *Consumer) deadLetterTo() string {
	return fmt.Sprintf("rejected to the dead-letter exchange of queue %q (RabbitMQ discards it if the queue has none)", c.Queue)
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

// closeErr prefers the broker's reason for a close, when it sent one, to
// the client's generic error.
func closeErr(closed <-chan *amqp.Error, err error) error {
	select {
	case e, ok := <-closed:
		if ok && e != nil {
			return closedBy(e)
		}
	default:
	}
	return err
}

// closedBy is the error for a channel closed with reason e (nil when the
// channel was closed by this process).
func closedBy(e *amqp.Error) error {
	if e == nil {
		return ErrChannelClosed
	}
	return fmt.Errorf("%w: %w", ErrChannelClosed, e)
}

// channelClosed is the error for a failed ack, nack or reject: the only
// way they fail is a channel that is no longer open.
func channelClosed(cause error) error {
	if cause == nil || errors.Is(cause, amqp.ErrClosed) {
		return ErrChannelClosed
	}
	return fmt.Errorf("%w: %w", ErrChannelClosed, cause)
}

// uniqueTag returns a consumer tag unique to this Run, so that two Runs
// on one channel cannot collide.
func uniqueTag() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (Go 1.24+)
	return "idemhttp-" + hex.EncodeToString(b)
}
