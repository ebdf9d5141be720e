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

// deliveryCountHeader is the header in which a quorum queue counts a
// message's earlier deliveries that were returned (RabbitMQ 3.10 and
// later).
const deliveryCountHeader = "x-delivery-count"

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
	// Tag is the consumer tag. Empty means a unique tag chosen by the
	// client library.
	Tag string
	// Prefetch is the channel's QoS prefetch count: how many
	// unacknowledged deliveries the broker sends ahead of the handler.
	// Zero means [DefaultPrefetch]; AMQP's own zero ("unlimited") is not
	// offered, as it lets one consumer take a whole backlog that other
	// consumers could be working on. A delivery waiting out its retry
	// delay counts against it.
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
	// Retry says when a delivery whose handler returned an error comes
	// back, and after how many deliveries it is dead-lettered instead.
	// The zero value is [inbox.Retry]'s default: 1 s doubling to 5 min,
	// 5 deliveries. RabbitMQ has no delayed requeue: Run holds the failed
	// delivery, unacknowledged, for the delay, then requeues it (nack),
	// and goes on with other deliveries meanwhile. On the last delivery it
	// rejects it without requeue, which dead-letters it to the queue's
	// dead-letter exchange (declare one: x-dead-letter-exchange), and
	// reports it ([Consumer.OnDeadLetter] and a log line).
	//
	// Deliveries are counted by the queue when it is a quorum queue (its
	// x-delivery-count header, across every consumer and restart), else
	// by this Run (a classic queue only says "redelivered"), so a poison
	// message on a classic queue gets up to MaxDeliveries deliveries per
	// Run that meets it. On a quorum queue, a message delivered more often
	// than that without ever being settled (one that kills its consumer)
	// is rejected on arrival, without running the handler. A quorum
	// queue's own delivery-limit argument bounds it at the broker too.
	Retry inbox.Retry
	// ProcessingLimit bounds how long one delivery's handler runs. When it
	// passes, the handler's context ends (an inbox transaction rolls back,
	// see [inbox.SQL]) and Run requeues the delivery at once, so that
	// another consumer gets it, even if the handler goes on; Run waits for
	// the handler to return before it takes the next delivery, and never
	// acknowledges the requeued one. It counts as a failed delivery. Zero
	// means [inbox.DefaultProcessingLimit]; negative means no limit
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
// After h returns nil, Run acknowledges the delivery. After h returns an
// error, Run requeues it after [Consumer.Retry]'s delay, or dead-letters
// it on its last delivery, and goes on: a handler error never stops Run.
// h gets a context that ends with ctx or at [Consumer.ProcessingLimit].
//
// Shutdown loses nothing: when ctx is done while h runs, Run waits for h,
// acknowledges the delivery if h returned nil (its effect committed) and
// requeues it otherwise, whatever the settings (never a reject, never a
// dead letter). Then it cancels its consumer, returns every delivery the
// broker had sent ahead, and every delivery waiting out a retry delay, to
// the queue (nack with requeue), and returns ctx.Err(). Otherwise it
// returns an error wrapping [ErrChannelClosed], [ErrConsumerCancelled] or
// [inbox.ErrNoMessageID]; a failed ack, nack or reject ends Run too, as it
// means the channel is gone. Run sets the channel's QoS, registers one
// consumer on it, uses the channel alone while it runs, and does not close
// it. No goroutine of Run's outlives it.
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
	r := &run{c: c, ch: ch, h: h, limit: c.ProcessingLimit, failures: make(map[string]int)}
	if r.limit == 0 {
		r.limit = inbox.DefaultProcessingLimit
	}
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
				return fmt.Errorf("%w (queue %q)", ErrConsumerCancelled, c.Queue)
			}
			if ctx.Err() != nil {
				// select chose this case over a done ctx: done wins.
				r.returning = append(r.returning, &d)
				return r.stop(ctx.Err())
			}
			err := r.handle(ctx, &d)
			if errors.Is(err, inbox.ErrNoMessageID) {
				// Leave the channel as the caller gave it: the
				// deliveries sent ahead go back now, not at close.
				return r.stop(err)
			}
			if err != nil {
				return err
			}
			if r.released && ctx.Err() == nil {
				// The processing limit cancelled the subscription (see
				// callHandler); take deliveries again.
				if err := r.subscribe(); err != nil {
					return fmt.Errorf("rabbitmq: consume %q again: %w", c.Queue, closeErr(closed, err))
				}
			}
		}
	}
}

// run is the state of one Run: the deliveries waiting out a retry delay
// (at most the prefetch count), and the failures this Run counted, for
// queues that do not count deliveries themselves.
type run struct {
	c     *Consumer
	ch    *amqp.Channel
	h     inbox.Handler
	limit time.Duration // ProcessingLimit, resolved; < 0: none

	tag        string               // of the current subscription
	deliveries <-chan amqp.Delivery // of the current subscription
	released   bool                 // the last handler passed its limit: the subscription is cancelled

	returning []*amqp.Delivery // to requeue once the subscription is cancelled
	parked    []parked
	timer     *time.Timer
	failures  map[string]int // message id -> failed deliveries seen by this Run
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
	if r.tag == "" || r.released {
		// A tag of its own for a second subscription: the broker may not
		// have forgotten the first one's yet.
		r.tag = uniqueTag()
	}
	r.released = false
	d, err := r.ch.Consume(r.c.Queue, r.tag, false, false, false, false, nil)
	if err != nil {
		return err
	}
	r.deliveries = d
	return nil
}

// maxCounted bounds run.failures: past it, the oldest counts are
// forgotten (a classic queue's poison message then gets more deliveries,
// never fewer).
const maxCounted = 4096

// handle runs h for one delivery and settles it, or parks it. It returns
// an error only when Run must stop.
func (r *run) handle(ctx context.Context, d *amqp.Delivery) error {
	c := r.c
	id, ok := c.messageID(d)
	m := newMessage(c.Queue, c.idSpace(), id, d)
	// Which delivery this is, once: r.failures changes only as d is settled
	// or parked.
	n := r.deliveryNumber(d, id)
	if !ok {
		if c.NoID == NoIDStop {
			// Requeued by stop, once the subscription is cancelled, so
			// that it does not come straight back here.
			r.returning = append(r.returning, d)
			return fmt.Errorf("rabbitmq: delivery %d on queue %q: %w", d.DeliveryTag, c.Queue, inbox.ErrNoMessageID)
		}
		if err := d.Reject(false); err != nil {
			return channelClosed(err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: inbox.ErrNoMessageID, To: c.deadLetterTo()})
		return nil
	}
	if c.Retry.Exhausted(n - 1) {
		// Delivered more often than allowed: its earlier deliveries never
		// settled, the consumers died on them (only a quorum queue counts
		// those). Running it again could kill this one too.
		if err := d.Reject(false); err != nil {
			return channelClosed(err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: fmt.Errorf("delivered %d times, more than allowed, without being settled", n), To: c.deadLetterTo()})
		return nil
	}
	released, err := r.callHandler(ctx, d, m)
	r.released = released
	if released {
		// Requeued at the processing limit: the delivery tag is spent.
		// Whatever the handler did, the broker delivers the message again
		// and the inbox serialises the two.
		c.logger().Warn("rabbitmq: handler passed its processing limit; delivery requeued",
			slog.String("queue", c.Queue), slog.String("id", id), slog.Bool("returned_nil", err == nil))
		return nil
	}
	if err == nil {
		// The effect committed. If this ack is lost (a crash now, a
		// dropped connection), the broker delivers the message again and
		// the inbox turns it away.
		delete(r.failures, id)
		if err := d.Ack(false); err != nil {
			return channelClosed(err)
		}
		return nil
	}
	if ctx.Err() != nil {
		// Shutdown: back to the queue, whatever the settings (stop
		// requeues it once the subscription is cancelled). The
		// transaction rolled back, the inbox row with it.
		r.returning = append(r.returning, d)
		return nil
	}
	if c.Retry.Exhausted(n) {
		delete(r.failures, id)
		if err := d.Reject(false); err != nil {
			return channelClosed(err)
		}
		c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: err, To: c.deadLetterTo()})
		return nil
	}
	r.count(id, n)
	r.park(d, time.Now().Add(c.Retry.After(n)))
	return nil
}

// callHandler runs h under the processing limit (inbox.Supervise). When
// the limit passes first, it cancels the subscription (so that the broker
// sends this stuck consumer nothing more) and requeues d and every
// delivery sent ahead, so that other consumers get them, and reports
// released. A shutdown does not release d: Run settles it once h returns,
// unless the limit passes first.
func (r *run) callHandler(ctx context.Context, d *amqp.Delivery, m *inbox.Message) (released bool, err error) {
	return inbox.Supervise(ctx, r.h, m, inbox.Supervision{Limit: r.limit, Release: func() {
		// Failures mean the channel is gone, and its deliveries with it.
		if err := r.ch.Cancel(r.tag, false); err != nil {
			return
		}
		_ = d.Nack(false, true)
		for ahead := range r.deliveries {
			_ = ahead.Nack(false, true)
		}
	}})
}

// deliveryNumber returns which delivery of its message d is: from the quorum
// queue's count when there is one, else from this Run's count and the
// redelivered flag.
func (r *run) deliveryNumber(d *amqp.Delivery, id string) int {
	if n, ok := deliveryCount(d.Headers[deliveryCountHeader]); ok {
		return n + 1
	}
	n := r.failures[id] + 1
	if d.Redelivered {
		n = max(n, 2)
	}
	return n
}

func deliveryCount(v any) (int, bool) {
	switch v := v.(type) {
	case int64:
		return int(v), v >= 0
	case int32:
		return int(v), v >= 0
	case int16:
		return int(v), v >= 0
	case int8:
		return int(v), v >= 0
	case int:
		return v, v >= 0
	}
	return 0, false
}

func (r *run) count(id string, n int) {
	if _, ok := r.failures[id]; !ok && len(r.failures) >= maxCounted {
		for k := range r.failures { // forget one
			delete(r.failures, k)
			break
		}
	}
	r.failures[id] = n
}

// park holds d until due.
func (r *run) park(d *amqp.Delivery, due time.Time) {
	r.parked = append(r.parked, parked{d: d, due: due})
	r.resetTimer()
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
