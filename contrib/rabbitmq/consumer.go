package rabbitmq

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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
	// it. RabbitMQ dead-letters a rejected message to the queue's
	// dead-letter exchange (the x-dead-letter-exchange queue argument or
	// policy), with an x-death header saying why; declare one, or the
	// broker discards the message. Run goes on with the next delivery.
	NoIDReject NoIDPolicy = iota
	// NoIDStop returns the delivery to the queue (nack with requeue) and
	// stops Run with an error wrapping [inbox.ErrNoMessageID]: the line
	// stops until a person looks. Every consumer of the queue stops the
	// same way when the message reaches it.
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
	// Tag is the consumer tag. Empty means a unique tag chosen by the
	// client library.
	Tag string
	// Prefetch is the channel's QoS prefetch count: how many
	// unacknowledged deliveries the broker sends ahead of the handler.
	// Zero means [DefaultPrefetch]; AMQP's own zero ("unlimited") is not
	// offered, as it lets one consumer take a whole backlog that other
	// consumers could be working on.
	Prefetch int
	// IDHeader names the header that holds the message id (a string or
	// bytes value). Empty means the message-id property.
	IDHeader string
	// NoID says what to do with a delivery that has no id. The zero value
	// is [NoIDReject].
	NoID NoIDPolicy
	// RejectOnError, when true, rejects a delivery whose handler returned
	// an error without requeueing it (so it is dead-lettered, see
	// [NoIDReject]). The default nacks it with requeue: it is delivered
	// again, to this or another consumer, and the handler runs again
	// (the inbox row was rolled back with the effect). A message that
	// always fails then loops: bound it with a quorum queue's
	// delivery-limit, which dead-letters it after that many deliveries.
	RejectOnError bool
	// RetryDelay is how long Run waits after a handler error before it
	// requeues the delivery and goes on (Run returns early, requeueing
	// it, when ctx is done meanwhile). Zero means at once. RabbitMQ has no
	// delayed requeue, and a requeued delivery comes straight back: with
	// no delay, a consumer whose database is down spins through its
	// queue. The wait holds up this consumer, which is what an outage
	// calls for; other consumers of the queue go on.
	RetryDelay time.Duration
}

// Run consumes c.Queue on ch until ctx is done, the channel closes, or a
// delivery with no id stops it (see [NoIDStop]), and passes each delivery
// to h, one at a time, in the order the broker sent them.
//
// After h returns nil, Run acknowledges the delivery; after h returns an
// error, Run nacks it (see [Consumer.RejectOnError] and
// [Consumer.RetryDelay]) and goes on: a handler error never stops Run. h gets ctx; when ctx is done while h
// runs, h's transaction should roll back and h return an error, and the
// delivery is requeued.
//
// Run sets the channel's QoS and registers one consumer on it, and uses
// the channel alone while it runs; it does not close the channel. When
// ctx is done Run cancels its consumer, returns every delivery the broker
// had sent ahead to the queue (nack with requeue), and returns ctx.Err().
// Otherwise it returns an error wrapping [ErrChannelClosed],
// [ErrConsumerCancelled] or [inbox.ErrNoMessageID]; a failed ack, nack or
// reject ends Run too, as it means the channel is gone. No goroutine of
// Run's outlives it.
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
	tag := c.Tag
	if tag == "" {
		tag = uniqueTag()
	}
	// Not ConsumeWithContext: its context would cancel the consumer from a
	// goroutine of the library's at any moment; Run cancels it itself, at
	// a point where it can account for every delivery sent ahead.
	deliveries, err := ch.Consume(c.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitmq: consume %q: %w", c.Queue, closeErr(closed, err))
	}
	for {
		select {
		case <-ctx.Done():
			return stop(ch, tag, deliveries, ctx.Err())
		case e := <-closed:
			return closedBy(e)
		case d, ok := <-deliveries:
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
				if err := d.Nack(false, true); err != nil {
					return ctx.Err()
				}
				return stop(ch, tag, deliveries, ctx.Err())
			}
			if err := c.handle(ctx, &d, h); err != nil {
				if errors.Is(err, inbox.ErrNoMessageID) {
					// Leave the channel as the caller gave it: the
					// deliveries sent ahead go back now, not at close.
					_ = stop(ch, tag, deliveries, nil)
				}
				return err
			}
		}
	}
}

// handle runs h for one delivery and settles it. It returns an error only
// when Run must stop.
func (c *Consumer) handle(ctx context.Context, d *amqp.Delivery, h inbox.Handler) error {
	id, ok := c.messageID(d)
	if !ok {
		if c.NoID == NoIDStop {
			if err := d.Nack(false, true); err != nil {
				return channelClosed(err)
			}
			return fmt.Errorf("rabbitmq: delivery %d on %q: %w", d.DeliveryTag, c.Queue, inbox.ErrNoMessageID)
		}
		if err := d.Reject(false); err != nil {
			return channelClosed(err)
		}
		return nil
	}
	if err := h(ctx, newMessage(c.Queue, id, d)); err != nil {
		// Requeue: the transaction rolled back, the inbox row with it, so
		// the next delivery runs the effect again.
		if c.RetryDelay > 0 && !c.RejectOnError {
			t := time.NewTimer(c.RetryDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		if err := d.Nack(false, !c.RejectOnError); err != nil {
			return channelClosed(err)
		}
		return nil
	}
	// The effect committed. If this ack is lost (a crash now, a dropped
	// connection), the broker delivers the message again and the inbox
	// turns it away.
	if err := d.Ack(false); err != nil {
		return channelClosed(err)
	}
	return nil
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

// stop cancels the consumer and requeues the deliveries sent ahead of the
// handler, then returns ret. The library delivers what it had buffered
// before it closes deliveries, once the broker confirmed the cancel.
func stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, ret error) error {
	if err := ch.Cancel(tag, false); err != nil {
		// The channel is gone, and its deliveries went back with it.
		return ret
	}
	for d := range deliveries {
		if err := d.Nack(false, true); err != nil {
			// Channel gone: the broker requeues the rest itself.
			break
		}
	}
	return ret
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
