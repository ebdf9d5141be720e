package sqs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idemhttp/inbox"
)

// API is the part of the SQS client [Consumer.Run] uses. [*sqs.Client]
// implements it; a test can give a fake.
type API interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, optFns ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessage(ctx context.Context, in *sqs.DeleteMessageInput, optFns ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error)
	ChangeMessageVisibility(ctx context.Context, in *sqs.ChangeMessageVisibilityInput, optFns ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error)
}

var _ API = (*sqs.Client)(nil)

// Defaults for the zero fields of [Consumer].
const (
	// DefaultMaxMessages is how many messages one receive asks for (SQS's
	// maximum).
	DefaultMaxMessages = 10
	// DefaultWaitTime is the long-poll wait of one receive (SQS's
	// maximum).
	DefaultWaitTime = 20 * time.Second
	// DefaultVisibilityTimeout is how long a received message stays
	// hidden from other consumers, renewed while its handler runs.
	DefaultVisibilityTimeout = 30 * time.Second
)

// settleTimeout bounds a delete or visibility change that Run finishes
// after ctx is done: a delete after a commit is worth completing.
const settleTimeout = 10 * time.Second

// NoIDPolicy says what [Consumer.Run] does with a message that carries no
// id. Neither choice deletes it: a message with no id cannot be
// deduplicated, so it is never passed to the handler, and never deleted
// as if it had been processed.
type NoIDPolicy int

const (
	// NoIDRedrive (the zero value) leaves the message as it is: it becomes
	// visible again when its visibility timeout ends, and once it has been
	// received the queue's maxReceiveCount times, the queue's redrive
	// policy moves it to the dead-letter queue. Configure one: without a
	// redrive policy the message comes back until its retention period
	// ends. Run goes on with the next message.
	NoIDRedrive NoIDPolicy = iota
	// NoIDStop makes the message visible again at once and stops Run with
	// an error wrapping [inbox.ErrNoMessageID]: the line stops until a
	// person looks.
	NoIDStop
)

// Consumer receives messages from one SQS queue and passes each to an
// [inbox.Handler], deleting it only after the handler returned nil: when
// the handler runs its effect through the inbox, that is after the
// effect's transaction committed.
//
// The order that makes a crash safe, for every message:
//
//  1. the handler inserts the message id into the inbox and writes its
//     effect, in one transaction, and commits;
//  2. Run deletes the message (DeleteMessage with its receipt handle).
//
// A crash between 1 and 2 leaves the message in the queue: it becomes
// visible when its visibility timeout ends, and the next receive, by any
// consumer, gets it again; the inbox finds the id and runs nothing. SQS
// standard queues also deliver a message twice now and then with no crash
// at all ("at-least-once delivery"), sometimes to two consumers at once;
// the inbox turns the second copy away the same way.
//
// Where the id comes from, by default: SQS's MessageId, which SQS assigns
// when it accepts a SendMessage and keeps across redeliveries. It does
// not survive a producer's retry: a producer that sends again because it
// never saw the first send's answer gets a second message with a new
// MessageId, and the inbox cannot tell the two apart. To dedup those,
// the producer must assign the id: in a message attribute
// ([Consumer.IDAttribute]), or, on a FIFO queue, as the
// MessageDeduplicationId ([Consumer.DeduplicationID]), which SQS also uses
// to drop a second send within 5 minutes.
//
// While a handler runs, Run extends its message's visibility timeout, so
// that a handler slower than the timeout does not have its message
// received by another consumer meanwhile.
//
// The zero value, with QueueURL set, is ready to use; a Consumer may be
// shared by several Run calls (it is only read).
type Consumer struct {
	// QueueURL is the queue's URL. Required.
	QueueURL string
	// IDAttribute names the message attribute (String type) holding the
	// producer's id. Empty means SQS's MessageId.
	IDAttribute string
	// DeduplicationID, when true, takes the id from the
	// MessageDeduplicationId system attribute (FIFO queues; with
	// content-based deduplication it is a SHA-256 of the body). It
	// cannot be combined with IDAttribute.
	DeduplicationID bool
	// NoID says what to do with a message with no id. The zero value is
	// [NoIDRedrive].
	NoID NoIDPolicy
	// MaxMessages is how many messages one receive asks for, 1 to 10.
	// Zero means [DefaultMaxMessages]. Messages of a batch wait while the
	// ones before them are handled, and their visibility timeout runs
	// meanwhile: keep MaxMessages times the handler's usual duration
	// well under VisibilityTimeout.
	MaxMessages int32
	// WaitTime is the long-poll wait of one receive, whole seconds up to
	// 20 s. Zero means [DefaultWaitTime]; negative means short polling.
	WaitTime time.Duration
	// VisibilityTimeout is how long a received message stays hidden,
	// whole seconds. Zero means [DefaultVisibilityTimeout]. Run extends
	// it by this much every third of it while the message's handler runs.
	VisibilityTimeout time.Duration
	// RetryDelay is how long a message whose handler returned an error
	// stays hidden before it is received again. Zero means it is visible
	// again at once.
	RetryDelay time.Duration
	// OnSettleError, when set, is called with each error of a delete or
	// visibility change that Run does not stop for: the message comes
	// back when its visibility ends, and the inbox turns it away if its
	// effect had committed. Nil means such errors are dropped.
	OnSettleError func(messageID string, err error)
}

// Run receives from c.QueueURL until ctx is done or a receive fails, and
// passes each message to h, one at a time.
//
// After h returns nil, Run deletes the message; after h returns an error,
// Run makes it visible again after [Consumer.RetryDelay] and goes on: a
// handler error never stops Run. h gets ctx; when ctx is done while h
// runs, h's transaction should roll back and h return an error.
//
// When ctx is done Run makes the messages it received and did not handle
// visible again, so other consumers get them at once, and returns
// ctx.Err(). Otherwise it returns the receive's error, or an error
// wrapping [inbox.ErrNoMessageID] (see [NoIDStop]). No goroutine of Run's
// outlives it.
func (c *Consumer) Run(ctx context.Context, api API, h inbox.Handler) error {
	if c.QueueURL == "" {
		return errors.New("sqs: Consumer.QueueURL is empty")
	}
	if c.DeduplicationID && c.IDAttribute != "" {
		return errors.New("sqs: Consumer.DeduplicationID and IDAttribute are exclusive")
	}
	if h == nil {
		return errors.New("sqs: nil handler")
	}
	in := c.receiveInput()
	visibility := time.Duration(in.VisibilityTimeout) * time.Second
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		out, err := api.ReceiveMessage(ctx, in)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("sqs: receive: %w", err)
		}
		for i := range out.Messages {
			if ctx.Err() != nil {
				c.release(ctx, api, out.Messages[i:])
				return ctx.Err()
			}
			if err := c.handle(ctx, api, &out.Messages[i], h, visibility); err != nil {
				c.release(ctx, api, out.Messages[i+1:])
				return err
			}
		}
	}
}

// receiveInput is the ReceiveMessage request Run repeats.
func (c *Consumer) receiveInput() *sqs.ReceiveMessageInput {
	in := &sqs.ReceiveMessageInput{
		QueueUrl:            &c.QueueURL,
		MaxNumberOfMessages: c.MaxMessages,
		VisibilityTimeout:   seconds(c.VisibilityTimeout, DefaultVisibilityTimeout),
		WaitTimeSeconds:     seconds(c.WaitTime, DefaultWaitTime),
	}
	if in.MaxNumberOfMessages <= 0 || in.MaxNumberOfMessages > 10 {
		in.MaxNumberOfMessages = DefaultMaxMessages
	}
	if c.WaitTime < 0 {
		in.WaitTimeSeconds = 0
	}
	if in.WaitTimeSeconds > 20 {
		in.WaitTimeSeconds = 20
	}
	// For inbox.Message's Time and Redelivered.
	in.MessageSystemAttributeNames = []types.MessageSystemAttributeName{
		types.MessageSystemAttributeNameSentTimestamp,
		types.MessageSystemAttributeNameApproximateReceiveCount,
	}
	switch {
	case c.IDAttribute != "":
		// All string attributes, for inbox.Message's Header; the id's
		// among them.
		in.MessageAttributeNames = []string{"All"}
	case c.DeduplicationID:
		in.MessageSystemAttributeNames = append(in.MessageSystemAttributeNames, types.MessageSystemAttributeNameMessageDeduplicationId)
	}
	return in
}

// handle runs h for one message and settles it. It returns an error only
// when Run must stop.
func (c *Consumer) handle(ctx context.Context, api API, m *types.Message, h inbox.Handler, visibility time.Duration) error {
	id := c.messageID(m)
	if id == "" {
		if c.NoID == NoIDStop {
			c.setVisibility(ctx, api, m, 0)
			return fmt.Errorf("sqs: message %s: %w", deref(m.MessageId), inbox.ErrNoMessageID)
		}
		return nil
	}
	err := c.withExtension(ctx, api, m, visibility, func() error { return h(ctx, newMessage(c.QueueURL, id, m)) })
	if err != nil {
		// The transaction rolled back, the inbox row with it, so the
		// next receive runs the effect again.
		c.setVisibility(ctx, api, m, c.RetryDelay)
		return nil
	}
	// The effect committed. If this delete is lost (a crash now, a
	// network error), the message comes back when its visibility ends and
	// the inbox turns it away.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if _, err := api.DeleteMessage(sctx, &sqs.DeleteMessageInput{QueueUrl: &c.QueueURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
		c.settleError(id, fmt.Errorf("sqs: delete: %w", err))
	}
	return nil
}

// messageID returns m's id from the configured place, or "" when it has
// none.
func (c *Consumer) messageID(m *types.Message) string {
	switch {
	case c.IDAttribute != "":
		v, ok := m.MessageAttributes[c.IDAttribute]
		if !ok {
			return ""
		}
		if v.StringValue != nil {
			return *v.StringValue
		}
		return string(v.BinaryValue)
	case c.DeduplicationID:
		return m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
	default:
		return deref(m.MessageId)
	}
}

// withExtension runs fn, extending m's visibility by visibility every
// third of it, and returns fn's error. The extending goroutine ends
// before withExtension returns.
func (c *Consumer) withExtension(ctx context.Context, api API, m *types.Message, visibility time.Duration, fn func() error) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(visibility / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				c.setVisibility(ctx, api, m, visibility)
			}
		}
	})
	defer wg.Wait()
	defer close(done)
	return fn()
}

// release makes msgs visible again at once.
func (c *Consumer) release(ctx context.Context, api API, msgs []types.Message) {
	for i := range msgs {
		c.setVisibility(ctx, api, &msgs[i], 0)
	}
}

func (c *Consumer) setVisibility(ctx context.Context, api API, m *types.Message, d time.Duration) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_, err := api.ChangeMessageVisibility(sctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          &c.QueueURL,
		ReceiptHandle:     m.ReceiptHandle,
		VisibilityTimeout: seconds(d, 0),
	})
	if err != nil {
		c.settleError(deref(m.MessageId), fmt.Errorf("sqs: change visibility: %w", err))
	}
}

func (c *Consumer) settleError(id string, err error) {
	if c.OnSettleError != nil {
		c.OnSettleError(id, err)
	}
}

// seconds is d in whole seconds, rounded up (a visibility shorter than
// asked for could expose a message early), or def's when d is zero.
func seconds(d, def time.Duration) int32 {
	if d == 0 {
		d = def
	}
	if d <= 0 {
		return 0
	}
	s := (d + time.Second - 1) / time.Second
	if s > math.MaxInt32 {
		return math.MaxInt32
	}
	return int32(s)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
