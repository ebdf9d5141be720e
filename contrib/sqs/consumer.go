package sqs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
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
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, optFns ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
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

// maxVisibility is the longest visibility timeout SQS accepts.
const maxVisibility = 12 * time.Hour

// settleTimeout bounds a delete or visibility change that Run finishes
// after ctx is done: a delete after a commit is worth completing.
const settleTimeout = 10 * time.Second

var (
	// ErrNoRedrivePolicy: the queue has no redrive policy, so a message
	// whose handler always fails would never reach a dead-letter queue:
	// SQS would delete it, silently, when its retention period ends.
	// [Consumer.Run] refuses such a queue unless [Consumer.NoRedrivePolicy]
	// is set.
	ErrNoRedrivePolicy = errors.New("sqs: the queue has no redrive policy")

	// ErrContentBasedID: the message's id, its MessageDeduplicationId, is
	// the SHA-256 of its body, as a FIFO queue with content-based
	// deduplication makes it when the producer sets none. Two different
	// messages with the same body (two equal payments) would have one id
	// and the inbox would run only the first: Run treats such a message
	// as one without an id ([Consumer.NoID]), and its error wraps
	// [inbox.ErrNoMessageID] too.
	ErrContentBasedID = fmt.Errorf("sqs: the MessageDeduplicationId is the SHA-256 of the body (content-based deduplication), no id of the producer's: %w", inbox.ErrNoMessageID)
)

// NoIDPolicy says what [Consumer.Run] does with a message that carries no
// id. Neither choice deletes it: a message with no id cannot be
// deduplicated, so it is never passed to the handler, and never deleted
// as if it had been processed.
type NoIDPolicy int

const (
	// NoIDRedrive (the zero value) leaves the message in the queue, hidden
	// for [Consumer.Retry]'s delay: once it has been received the queue's
	// maxReceiveCount times, the redrive policy moves it to the
	// dead-letter queue, and Run reports it ([Consumer.OnDeadLetter] and a
	// log line) on that last receive. Run goes on with the next message.
	NoIDRedrive NoIDPolicy = iota
	// NoIDStop makes the message visible again at once and stops Run with
	// an error wrapping [inbox.ErrNoMessageID] that names the queue: the
	// line stops until a person looks.
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
	// MessageDeduplicationId system attribute (FIFO queues). An id that is
	// the SHA-256 of the body, which is what content-based deduplication
	// makes when the producer sets none, is refused ([ErrContentBasedID]).
	// It cannot be combined with IDAttribute.
	DeduplicationID bool
	// IDSpace is the [inbox.Message.IDSpace] of the messages: the space in
	// which their ids are unique. Empty means the queue's URL. Give the
	// consumers of several queues the same IDSpace to declare that their
	// ids are one space, which the inbox then dedups across them.
	IDSpace string
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
	// Retry says how long a message whose handler failed stays hidden
	// before it is received again: a delay that doubles with the
	// message's failures as [Consumer.Ledger] counts them (not with its
	// receive count, which shutdowns raise too), 1 s to 5 min by default,
	// at most 12 hours. The queue's redrive policy, not Retry, decides
	// when it goes to the dead-letter queue: after maxReceiveCount
	// receives, by SQS's own count (see Shutdown and maxReceiveCount in
	// the package documentation). Without a redrive policy
	// ([Consumer.NoRedrivePolicy]), Retry.MaxDeliveries is when Run starts
	// reporting the message as one that holds up its queue.
	Retry inbox.Retry
	// Ledger counts each message's failed handler runs, for every
	// instance and restart, from which the retry delays grow: give it the
	// inbox's (inbox.SQL.Ledger, contrib/postgres's Inbox.Ledger) with
	// the consumer name of the handler's inbox. Nil means a count of this
	// Run's own ([inbox.MemoryLedger]).
	Ledger inbox.Ledger
	// NoRedrivePolicy, when true, lets Run consume a queue that has no
	// redrive policy. A message whose handler always fails then comes
	// back, Retry.MaxDelay apart, until the queue's retention period ends
	// and SQS deletes it; Run reports it at every failure from
	// Retry.MaxDeliveries on. The default refuses such a queue
	// ([ErrNoRedrivePolicy]).
	NoRedrivePolicy bool
	// ProcessingLimit bounds how long one message's handler runs. When it
	// passes, the handler's context ends (an inbox transaction rolls back,
	// see [inbox.SQL]), the visibility extensions stop, the failure is
	// counted, and Run makes the message visible at once, so that another consumer receives it, even
	// if the handler goes on; Run waits for the handler to return before
	// it takes the next message, and never deletes the message it
	// released. Zero means [inbox.DefaultProcessingLimit]; negative means
	// no limit.
	ProcessingLimit time.Duration
	// OnSettleError, when set, is called with each error of a delete or
	// visibility change that Run does not stop for: the message comes
	// back when its visibility ends, and the inbox turns it away if its
	// effect had committed. Nil means such errors are dropped.
	OnSettleError func(messageID string, err error)
	// OnDeadLetter, when set, is called (from Run's goroutine) for each
	// message on its way to the dead-letter queue (failed, or without an
	// id, on its maxReceiveCount-th receive), or, without a redrive
	// policy, holding up the queue. Run also logs each at level Error.
	OnDeadLetter func(inbox.DeadLetter)
	// Logger receives Run's log lines; nil means [slog.Default].
	Logger *slog.Logger
}

// Run receives from c.QueueURL until ctx is done or a receive fails, and
// passes each message to h, one at a time.
//
// Before it receives, Run reads the queue's redrive policy
// (GetQueueAttributes) and returns an error wrapping [ErrNoRedrivePolicy]
// when there is none, unless [Consumer.NoRedrivePolicy] is set. Each
// message goes through the message core ([inbox.Runner]), which decides
// from [Consumer.Ledger]; Run maps its decisions onto SQS's verbs. After
// h returns nil, Run deletes the message; after h returns an error, Run
// hides it for [Consumer.Retry]'s delay and goes on: a handler error never
// stops Run. h gets a context that ends with ctx or at
// [Consumer.ProcessingLimit].
//
// Shutdown loses nothing: when ctx is done while h runs, Run waits for h,
// deletes the message if h returned nil (its effect committed) and makes
// it visible at once otherwise, whatever the settings. A receive in
// progress is not cancelled: Run waits for it (at most WaitTime). It
// makes the messages it received and did not handle visible again, so
// other consumers get them at once, and returns ctx.Err(). Each shutdown
// so costs each of those messages one receive toward the redrive policy's
// maxReceiveCount, and no more. Otherwise it returns the receive's error,
// or an error wrapping [inbox.ErrNoMessageID] (see [NoIDStop]). No
// goroutine of Run's outlives it.
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
	r := &run{c: c, api: api}
	if err := r.readRedrive(ctx); err != nil {
		return err
	}
	in := c.receiveInput()
	r.visibility = time.Duration(in.VisibilityTimeout) * time.Second
	limit := c.ProcessingLimit
	if limit == 0 {
		limit = inbox.DefaultProcessingLimit
	}
	// The queue's redrive policy dead-letters, by SQS's own receive
	// count: the core never does (no limit), and decides the rest from
	// the ledger.
	retry := c.Retry
	retry.MaxDeliveries = -1
	p := inbox.Policy{Retry: retry}
	if c.NoID == NoIDStop {
		p.NoID = inbox.NoIDStop
	}
	r.runner = &inbox.Runner{Policy: p, Ledger: c.Ledger, Handler: h, Limit: limit, Every: r.visibility / 3}
	// A receive is not cancelled by ctx: SQS goes on with a long poll
	// whose client has gone, and the messages it then receives cost a
	// receive each and stay hidden for the visibility timeout, unseen.
	// Run waits for it instead (at most WaitTime) and makes what it
	// brought visible at once.
	receiveTimeout := time.Duration(in.WaitTimeSeconds)*time.Second + settleTimeout
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), receiveTimeout)
		out, err := api.ReceiveMessage(rctx, in)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("sqs: receive: %w", err)
		}
		for i := range out.Messages {
			if ctx.Err() != nil {
				r.release(ctx, out.Messages[i:])
				return ctx.Err()
			}
			r.rest = out.Messages[i+1:]
			err := r.handle(ctx, &out.Messages[i])
			rest := r.rest
			r.rest = nil
			if err != nil {
				r.release(ctx, rest)
				return err
			}
			if rest == nil {
				break // released at the processing limit, with the message
			}
		}
	}
}

// run is one Run's settings, resolved.
type run struct {
	c          *Consumer
	api        API
	runner     *inbox.Runner
	visibility time.Duration
	maxRecv    int    // the redrive policy's maxReceiveCount; 0: no policy
	dlq        string // the redrive policy's dead-letter queue
	// rest holds the messages of the receive behind the one being
	// handled; the release at its processing limit makes them visible
	// too, and sets rest to nil.
	rest []types.Message
}

// readRedrive reads the queue's redrive policy.
func (r *run) readRedrive(ctx context.Context) error {
	out, err := r.api.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       &r.c.QueueURL,
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameRedrivePolicy},
	})
	if err != nil {
		return fmt.Errorf("sqs: read the queue's redrive policy (GetQueueAttributes): %w", err)
	}
	policy := out.Attributes[string(types.QueueAttributeNameRedrivePolicy)]
	if policy == "" {
		if r.c.NoRedrivePolicy {
			return nil
		}
		return fmt.Errorf("%w: %s (give it one with a dead-letter queue, or set Consumer.NoRedrivePolicy)", ErrNoRedrivePolicy, r.c.QueueURL)
	}
	n, dlq, err := parseRedrive(policy)
	if err != nil {
		return fmt.Errorf("sqs: the queue's redrive policy %q: %w", policy, err)
	}
	r.maxRecv, r.dlq = n, dlq
	return nil
}

// parseRedrive reads a queue's RedrivePolicy attribute, JSON whose
// maxReceiveCount SQS gives as a number or as a string of one.
func parseRedrive(policy string) (maxReceiveCount int, deadLetterQueue string, err error) {
	var p struct {
		DeadLetterTargetArn string          `json:"deadLetterTargetArn"`
		MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
	}
	if err := json.Unmarshal([]byte(policy), &p); err != nil {
		return 0, "", err
	}
	raw := string(p.MaxReceiveCount)
	if unq, err := strconv.Unquote(raw); err == nil {
		raw = unq
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		return 0, "", errors.New("no maxReceiveCount of 1 or more")
	}
	return n, p.DeadLetterTargetArn, nil
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
	// For inbox.Message's Time and Redelivered, and the retry delay.
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

// handle runs one message through the message core (inbox.Runner) and
// maps its decision onto SQS's verbs: a delete, a visibility change. It
// returns an error only when Run must stop.
func (r *run) handle(ctx context.Context, sm *types.Message) error {
	c := r.c
	id, idErr := c.messageID(sm)
	// The receive count only says whether the run is worth a durable
	// marker, and when the redrive policy moves the message: the delays
	// come from the ledger's count of failures.
	n := receiveCount(sm)
	m := newMessage(c.QueueURL, c.idSpace(), id, sm, n)
	arrival := inbox.Arrival{HasID: idErr == nil, Stopping: ctx.Err() != nil, MaybeRedelivered: n > 1}
	dec, state := r.runner.Deliver(ctx, m, inbox.Key{IDSpace: m.IDSpace, ID: id}, arrival, inbox.Hooks{
		Beat: func() { r.setVisibility(ctx, sm, r.visibility) },
		Release: func() {
			r.setVisibility(ctx, sm, 0)
			// Received with it, behind it: visible now, for other
			// consumers, rather than when their visibility ends. (Each
			// has cost its receive already.)
			r.release(ctx, r.rest)
			r.rest = nil
		},
	})
	switch dec.Verb {
	case inbox.VerbAck:
		// The effect committed (or the message was done before). If this
		// delete is lost (a crash now, a network error), the message
		// comes back when its visibility ends and the inbox turns it
		// away.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
		defer cancel()
		if _, err := r.api.DeleteMessage(sctx, &sqs.DeleteMessageInput{QueueUrl: &c.QueueURL, ReceiptHandle: sm.ReceiptHandle}); err != nil {
			c.settleError(id, fmt.Errorf("sqs: delete: %w", err))
		}
		return nil
	case inbox.VerbRequeue:
		// At once (a shutdown: whatever the settings), or after the delay
		// of the failures the ledger counts.
		r.setVisibility(ctx, sm, min(dec.Delay, maxVisibility))
		if dec.Delay > 0 {
			r.reportIfLast(m, n, dec.Failures, dec.Err)
		}
		return nil
	case inbox.VerbDeadLetter:
		// No id: SQS's redrive policy dead-letters it, after
		// maxReceiveCount receives; until then it stays hidden for the
		// retry delay.
		r.setVisibility(ctx, sm, r.retryDelay(n))
		// No record to forget (no id): the core settles it.
		r.runner.DeadLettered(ctx, state, inbox.Key{IDSpace: m.IDSpace, ID: id}, nil)
		r.reportIfLast(m, n, n, idErr)
		return nil
	case inbox.VerbStop:
		r.setVisibility(ctx, sm, 0)
		return fmt.Errorf("sqs: message %s on %s: %w", deref(sm.MessageId), c.QueueURL, idErr)
	}
	if state.State() == inbox.StateReleased {
		// Visible again at the processing limit: whatever the handler
		// did, another consumer receives the message and the inbox
		// serialises the two. Its receipt handle is spent.
		c.logger().Warn("sqs: handler passed its processing limit; message made visible",
			slog.String("queue", c.QueueURL), slog.String("id", id))
		return nil
	}
	// No decision (a refused move: a bug): visible again, never deleted.
	r.setVisibility(ctx, sm, 0)
	return dec.Err
}

func (r *run) retryDelay(n int) time.Duration {
	return min(r.c.Retry.After(max(n, 1)), maxVisibility)
}

// reportIfLast reports a message that failed on its n-th receive (its
// failures-th failure by the ledger) when the redrive policy moves it to
// the dead-letter queue at its next receive, or, without a policy, when
// its failures are past Retry's limit.
func (r *run) reportIfLast(m *inbox.Message, n, failures int, err error) {
	switch {
	case r.maxRecv > 0 && n >= r.maxRecv:
		r.c.report(inbox.DeadLetter{Message: m, Deliveries: n, Err: err,
			To: fmt.Sprintf("moved by the queue's redrive policy (maxReceiveCount %d) to %s at its next receive", r.maxRecv, r.dlq)})
	case r.maxRecv == 0 && r.c.Retry.Exhausted(failures):
		r.c.report(inbox.DeadLetter{Message: m, Deliveries: failures, Err: err,
			To: "stays in the queue, which has no redrive policy: SQS deletes it when the retention period ends"})
	}
}

// messageID returns m's id from the configured place; the error is
// inbox.ErrNoMessageID when it has none, and ErrContentBasedID when its
// deduplication id is its body's hash.
func (c *Consumer) messageID(m *types.Message) (string, error) {
	var id string
	switch {
	case c.IDAttribute != "":
		if v, ok := m.MessageAttributes[c.IDAttribute]; ok {
			if v.StringValue != nil {
				id = *v.StringValue
			} else {
				id = string(v.BinaryValue)
			}
		}
	case c.DeduplicationID:
		id = m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)]
		if id != "" {
			// SQS's content-based deduplication id is the hex SHA-256 of
			// the body: an id of the payload, not of the message.
			sum := sha256.Sum256([]byte(deref(m.Body)))
			if id == hex.EncodeToString(sum[:]) {
				return id, ErrContentBasedID
			}
		}
	default:
		id = deref(m.MessageId)
	}
	if id == "" {
		return "", inbox.ErrNoMessageID
	}
	return id, nil
}

func (c *Consumer) idSpace() string {
	if c.IDSpace != "" {
		return c.IDSpace
	}
	return c.QueueURL
}

// receiveCount is m's ApproximateReceiveCount, 1 when absent.
func receiveCount(m *types.Message) int {
	n, err := strconv.Atoi(m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// release makes msgs visible again at once.
func (r *run) release(ctx context.Context, msgs []types.Message) {
	for i := range msgs {
		r.setVisibility(ctx, &msgs[i], 0)
	}
}

func (r *run) setVisibility(ctx context.Context, m *types.Message, d time.Duration) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_, err := r.api.ChangeMessageVisibility(sctx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl:          &r.c.QueueURL,
		ReceiptHandle:     m.ReceiptHandle,
		VisibilityTimeout: seconds(d, 0),
	})
	if err != nil {
		r.c.settleError(deref(m.MessageId), fmt.Errorf("sqs: change visibility: %w", err))
	}
}

func (c *Consumer) settleError(id string, err error) {
	if c.OnSettleError != nil {
		c.OnSettleError(id, err)
	}
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
