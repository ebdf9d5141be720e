package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
)

// fakeSQS is an in-memory SQS queue with the semantics the consumer
// relies on: a received message is hidden until its visibility timeout
// ends, each receive issues a new receipt handle and invalidates the old
// one, and only a current receipt handle deletes a message or changes its
// visibility. Time does not pass by itself for visibility: a hidden
// message comes back only when the test calls expire (as SQS would once
// its timeout ended). A long poll on an empty queue waits for a message
// or for its WaitTimeSeconds; one whose client gives up (its context
// ends) goes on, as SQS's does, until its wait time ends, and receives
// the messages sent meanwhile into a response nobody reads: they are
// hidden, their receive counted.
type fakeSQS struct {
	mu       sync.Mutex
	msgs     []*fakeMsg
	seq      int
	received chan struct{} // a receive found the queue empty (buffered, 1)
	changed  chan int32    // every visibility change, if not nil

	// Faults to inject: the next failDeletes deletes fail having done
	// nothing, and so does every delete for which failDelete (if set)
	// returns true.
	failDeletes int
	failDelete  func() bool
	deletes     int
	changes     []int32

	// redrive is the queue's RedrivePolicy attribute; "" for none. When
	// set, a message received maxReceiveCount times moves, at its next
	// receive, to dead, as SQS's redrive does.
	redrive         string
	maxReceiveCount int
	dead            []*fakeMsg

	// realTime makes a visibility timeout end by itself, at its time,
	// instead of at expire.
	realTime bool

	arrived chan struct{} // closed (and replaced) by every send
	ghosts  []time.Time   // the ends of long polls whose clients gave up
	lost    int           // messages received into such a poll
}

type fakeMsg struct {
	id        string
	body      string
	attrs     map[string]types.MessageAttributeValue
	system    map[string]string
	handle    string // current receipt handle; "" while visible
	visibleAt time.Time
	deleted   bool
	recvs     int
}

var _ sqsinbox.API = (*fakeSQS)(nil)

// newFake returns an empty queue with a redrive policy of
// maxReceiveCount 5.
func newFake() *fakeSQS {
	f := &fakeSQS{received: make(chan struct{}, 1), arrived: make(chan struct{})}
	f.setRedrive(5)
	return f
}

// setRedrive gives the queue a redrive policy of maxReceiveCount n, or
// none when n is 0.
func (f *fakeSQS) setRedrive(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxReceiveCount = n
	f.redrive = ""
	if n > 0 {
		f.redrive = fmt.Sprintf(`{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:123456789012:orders-dlq","maxReceiveCount":%d}`, n)
	}
}

// deadLettered returns the bodies of the messages the redrive moved.
func (f *fakeSQS) deadLettered() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.dead {
		out = append(out, m.body)
	}
	return out
}

func (f *fakeSQS) GetQueueAttributes(_ context.Context, in *sqs.GetQueueAttributesInput, _ ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &sqs.GetQueueAttributesOutput{Attributes: map[string]string{}}
	for _, name := range in.AttributeNames {
		if name == types.QueueAttributeNameRedrivePolicy && f.redrive != "" {
			out.Attributes[string(name)] = f.redrive
		}
	}
	return out, nil
}

// send adds a message; a nil attrs and system are fine.
func (f *fakeSQS) send(body string, attrs map[string]types.MessageAttributeValue, system map[string]string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	id := fmt.Sprintf("sqs-%04d", f.seq)
	m := &fakeMsg{id: id, body: body, attrs: attrs, system: system}
	f.msgs = append(f.msgs, m)
	// A long poll whose client gave up and whose wait has not ended
	// receives it: hidden, its receive counted, its response lost.
	now := time.Now()
	for len(f.ghosts) > 0 && !f.ghosts[0].After(now) {
		f.ghosts = f.ghosts[1:]
	}
	if len(f.ghosts) > 0 {
		f.seq++
		m.recvs++
		m.handle = fmt.Sprintf("rh-%s-%d-lost", m.id, f.seq)
		f.lost++
	}
	close(f.arrived)
	f.arrived = make(chan struct{})
	return id
}

// receives returns, for each message not deleted, by body, its receive
// count and whether it is hidden.
func (f *fakeSQS) receives() map[string][2]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][2]int{}
	for _, m := range f.msgs {
		if !m.deleted {
			hidden := 0
			if m.handle != "" {
				hidden = 1
			}
			out[m.body] = [2]int{m.recvs, hidden}
		}
	}
	return out
}

// expire ends the visibility timeout of every hidden message.
func (f *fakeSQS) expire() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs {
		m.handle = ""
	}
}

// live returns how many messages are not deleted, and how many of them
// are hidden.
func (f *fakeSQS) live() (n, hidden int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.msgs {
		if !m.deleted {
			n++
			if m.handle != "" {
				hidden++
			}
		}
	}
	return n, hidden
}

func (f *fakeSQS) ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, _ ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	end := time.Now().Add(time.Duration(in.WaitTimeSeconds) * time.Second)
	signalled := false
	for {
		out, arrived := f.receive(in)
		if len(out.Messages) > 0 {
			return out, nil
		}
		if !signalled {
			// Say the queue was found empty (once per receive).
			signalled = true
			select {
			case f.received <- struct{}{}:
			default:
			}
		}
		wait := time.Until(end)
		if wait <= 0 {
			return out, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-arrived:
			t.Stop()
		case <-t.C:
			return out, nil
		case <-ctx.Done():
			t.Stop()
			// The client is gone; the server's poll is not.
			f.mu.Lock()
			f.ghosts = append(f.ghosts, end)
			f.mu.Unlock()
			return nil, ctx.Err()
		}
	}
}

// receive receives what is visible, for in, and returns the channel that
// the next send closes.
func (f *fakeSQS) receive(in *sqs.ReceiveMessageInput) (*sqs.ReceiveMessageOutput, <-chan struct{}) {
	f.mu.Lock()
	var out sqs.ReceiveMessageOutput
	for _, m := range f.msgs {
		if int32(len(out.Messages)) == in.MaxNumberOfMessages {
			break
		}
		if f.realTime && m.handle != "" && !m.visibleAt.IsZero() && !time.Now().Before(m.visibleAt) {
			m.handle = ""
		}
		if m.deleted || m.handle != "" {
			continue
		}
		if f.maxReceiveCount > 0 && m.recvs >= f.maxReceiveCount {
			// The redrive policy: to the dead-letter queue, not to the
			// consumer.
			m.deleted = true
			f.dead = append(f.dead, m)
			continue
		}
		f.seq++
		m.recvs++
		m.handle = fmt.Sprintf("rh-%s-%d", m.id, f.seq)
		m.visibleAt = time.Now().Add(time.Duration(in.VisibilityTimeout) * time.Second)
		msg := types.Message{MessageId: aws.String(m.id), Body: aws.String(m.body), ReceiptHandle: aws.String(m.handle)}
		for _, name := range in.MessageAttributeNames {
			for k, v := range m.attrs {
				if name != "All" && name != k {
					continue
				}
				if msg.MessageAttributes == nil {
					msg.MessageAttributes = map[string]types.MessageAttributeValue{}
				}
				msg.MessageAttributes[k] = v
			}
		}
		for _, name := range in.MessageSystemAttributeNames {
			if name == types.MessageSystemAttributeNameApproximateReceiveCount {
				if msg.Attributes == nil {
					msg.Attributes = map[string]string{}
				}
				msg.Attributes[string(name)] = strconv.Itoa(m.recvs)
				continue
			}
			if v, ok := m.system[string(name)]; ok {
				if msg.Attributes == nil {
					msg.Attributes = map[string]string{}
				}
				msg.Attributes[string(name)] = v
			}
		}
		out.Messages = append(out.Messages, msg)
	}
	arrived := f.arrived
	f.mu.Unlock()
	return &out, arrived
}

func (f *fakeSQS) DeleteMessage(_ context.Context, in *sqs.DeleteMessageInput, _ ...func(*sqs.Options)) (*sqs.DeleteMessageOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failDeletes > 0 || (f.failDelete != nil && f.failDelete()) {
		f.failDeletes = max(f.failDeletes-1, 0)
		return nil, errors.New("fake: connection reset")
	}
	m := f.byHandle(aws.ToString(in.ReceiptHandle))
	if m == nil {
		return nil, &types.ReceiptHandleIsInvalid{Message: aws.String("stale receipt handle")}
	}
	m.deleted = true
	f.deletes++
	return &sqs.DeleteMessageOutput{}, nil
}

func (f *fakeSQS) ChangeMessageVisibility(_ context.Context, in *sqs.ChangeMessageVisibilityInput, _ ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.byHandle(aws.ToString(in.ReceiptHandle))
	if m == nil {
		return nil, &types.ReceiptHandleIsInvalid{Message: aws.String("stale receipt handle")}
	}
	f.changes = append(f.changes, in.VisibilityTimeout)
	if in.VisibilityTimeout == 0 {
		m.handle = ""
	}
	m.visibleAt = time.Now().Add(time.Duration(in.VisibilityTimeout) * time.Second)
	if f.changed != nil {
		select {
		case f.changed <- in.VisibilityTimeout:
		default:
		}
	}
	return &sqs.ChangeMessageVisibilityOutput{}, nil
}

func (f *fakeSQS) byHandle(h string) *fakeMsg {
	for _, m := range f.msgs {
		if !m.deleted && m.handle != "" && m.handle == h {
			return m
		}
	}
	return nil
}

// runUntilIdle runs c on f (or on api, which serves f, when given) until a
// receive finds the queue empty, then stops it and returns Run's error
// (nil when it stopped for that).
func runUntilIdle(c *sqsinbox.Consumer, f *fakeSQS, h inbox.Handler) error {
	return runUntilIdleVia(c, f, f, h)
}

func runUntilIdleVia(c *sqsinbox.Consumer, f *fakeSQS, api sqsinbox.API, h inbox.Handler) error {
	select {
	case <-f.received: // a signal from an earlier run
	default:
	}
	if c.WaitTime == 0 {
		// Short polling: Run's return waits for the receive in progress,
		// a long poll's wait time.
		cc := *c
		cc.WaitTime = -1
		c = &cc
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx, api, h) }()
	select {
	case err := <-errc:
		return err
	case <-f.received:
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	case <-time.After(30 * time.Second):
		cancel()
		<-errc
		return errors.New("fake: consumer did not drain the queue in 30 s")
	}
}
