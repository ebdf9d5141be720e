package nats

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

// NoIDPolicy says what [Consumer.Run] does with a message that carries no
// id. Neither choice acknowledges it: a message with no id cannot be
// deduplicated, so it is never passed to the handler, and never acked as
// if it had been processed.
type NoIDPolicy int

const (
	// NoIDTerm (the zero value) terminates the message (AckTerm): the
	// server never redelivers it and publishes a
	// $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED advisory naming its stream
	// sequence, from which a dead-letter process can fetch it. Run goes on
	// with the next message.
	NoIDTerm NoIDPolicy = iota
	// NoIDStop naks the message (it is redelivered) and stops Run with an
	// error wrapping [inbox.ErrNoMessageID]: the line stops until a person
	// looks.
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
// for pull consumers); with AckAll, acking one message acks every earlier
// one, including those still being handled elsewhere.
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
	// NakDelay is how long the server waits before redelivering a
	// message whose handler returned an error. Zero means at once.
	NakDelay time.Duration
	// Heartbeat is how often Run tells the server a message is still
	// being handled (AckProgress), which restarts its AckWait, so a
	// handler slower than AckWait does not have its message redelivered
	// to another client while it runs. Zero means a third of the
	// consumer's AckWait; negative means never.
	Heartbeat time.Duration
}

// Run pulls from cons until ctx is done or an error stops it, and passes
// each message to h, one at a time, in the order the server sent them.
//
// After h returns nil, Run acks the message; after h returns an error,
// Run naks it (redelivered after [Consumer.NakDelay]) and goes on: a
// handler error never stops Run. h gets ctx; when ctx is done while h
// runs, h's transaction should roll back and h return an error.
//
// When ctx is done Run naks the messages it had pulled and not handled,
// so the server can redeliver them before their AckWait ends, and returns
// ctx.Err(). Otherwise it returns the pull's error (a closed connection;
// [jetstream.ErrConsumerDeleted] when the consumer is deleted during a
// pull), an error wrapping [jetstream.ErrConsumerNotFound] when it was
// deleted between pulls, or an error wrapping [inbox.ErrNoMessageID] (see
// [NoIDStop]).
// No goroutine of Run's outlives it.
func (c *Consumer) Run(ctx context.Context, cons jetstream.Consumer, h inbox.Handler) error {
	if h == nil {
		return errors.New("nats: nil handler")
	}
	batch := c.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	maxWait := c.MaxWait
	if maxWait <= 0 {
		maxWait = DefaultMaxWait
	}
	heartbeat := c.Heartbeat
	if heartbeat == 0 {
		heartbeat = defaultHeartbeat(cons)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.fetchAndHandle(ctx, cons, h, batch, maxWait, heartbeat); err != nil {
			return err
		}
	}
}

// fetchAndHandle pulls one batch and handles it.
func (c *Consumer) fetchAndHandle(ctx context.Context, cons jetstream.Consumer, h inbox.Handler, batch int, maxWait, heartbeat time.Duration) error {
	// The pull's deadline is its expiry on the server too (the library
	// refuses FetchMaxWait with FetchContext); cancelling ctx ends it.
	fctx, cancel := context.WithTimeout(ctx, maxWait)
	defer cancel()
	msgs, err := cons.Fetch(batch, jetstream.FetchContext(fctx))
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
		stop = c.handle(ctx, msg, h, heartbeat)
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
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg, h inbox.Handler, heartbeat time.Duration) error {
	header := c.IDHeader
	if header == "" {
		header = DefaultIDHeader
	}
	id := msg.Headers().Get(header)
	if id == "" {
		if c.NoID == NoIDStop {
			if err := msg.Nak(); err != nil {
				return fmt.Errorf("nats: nak: %w", err)
			}
			return fmt.Errorf("nats: message on %q: %w", msg.Subject(), inbox.ErrNoMessageID)
		}
		if err := msg.Term(); err != nil {
			return fmt.Errorf("nats: term: %w", err)
		}
		return nil
	}
	err := withHeartbeat(msg, heartbeat, func() error { return h(ctx, newMessage(id, msg)) })
	if err != nil {
		// The transaction rolled back, the inbox row with it, so the
		// redelivery runs the effect again.
		if c.NakDelay > 0 {
			err = msg.NakWithDelay(c.NakDelay)
		} else {
			err = msg.Nak()
		}
		if err != nil {
			return fmt.Errorf("nats: nak: %w", err)
		}
		return nil
	}
	// The effect committed. If this ack is lost (a crash now, a dropped
	// connection), the server redelivers after AckWait and the inbox
	// turns the message away.
	if err := msg.Ack(); err != nil {
		return fmt.Errorf("nats: ack: %w", err)
	}
	return nil
}

// withHeartbeat runs fn, telling the server every interval that msg is
// still in progress, and returns fn's error. The heartbeat goroutine ends
// before withHeartbeat returns.
func withHeartbeat(msg jetstream.Msg, interval time.Duration, fn func() error) error {
	if interval <= 0 {
		return fn()
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				// A lost heartbeat costs a redelivery, which the inbox
				// turns away: nothing to do about an error here.
				_ = msg.InProgress()
			}
		}
	})
	defer wg.Wait()
	defer close(done)
	return fn()
}

// defaultHeartbeat is a third of the consumer's AckWait (JetStream's
// default AckWait, 30 s, when the consumer's info is not at hand).
func defaultHeartbeat(cons jetstream.Consumer) time.Duration {
	ackWait := 30 * time.Second
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait
	}
	return ackWait / 3
}
