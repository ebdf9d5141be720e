package sqs_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

func TestMain(m *testing.M) {
	testenv.Main(m, "", nil)
}

const queueURL = "https://sqs.example.invalid/123456789012/orders"

// recorder is a handler that records the ids it saw, in order.
type recorder struct {
	mu  sync.Mutex
	ids []string
	err func(id string, call int) error // nil: always succeed
}

func (r *recorder) handle(_ context.Context, m *inbox.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, m.ID)
	if r.err != nil {
		return r.err(m.ID, len(r.ids))
	}
	return nil
}

func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ids...)
}

func TestRunDeletesAfterHandler(t *testing.T) {
	f := newFake()
	a := f.send("a", nil, nil)
	b := f.send("b", nil, nil)
	var r recorder
	c := &sqsinbox.Consumer{QueueURL: queueURL}
	require.NoError(t, runUntilIdle(c, f, r.handle))
	assert.Equal(t, []string{a, b}, r.seen(), "the id is SQS's MessageId by default")
	n, _ := f.live()
	assert.Zero(t, n, "both deleted")
}

// A handler error leaves the message in the queue, visible again after
// RetryDelay, so the next receive runs the handler again.
// (With Run deleting before the handler, this test and the lost-delete one
// fail: checked once.)
func TestRunHandlerErrorRedelivers(t *testing.T) {
	f := newFake()
	id := f.send("a", nil, nil)
	r := recorder{err: func(_ string, call int) error {
		if call == 1 {
			return errors.New("database is down")
		}
		return nil
	}}
	c := &sqsinbox.Consumer{QueueURL: queueURL, RetryDelay: 0}
	require.NoError(t, runUntilIdle(c, f, r.handle))
	assert.Equal(t, []string{id, id}, r.seen(), "made visible at once, received again, handled again")
	n, _ := f.live()
	assert.Zero(t, n)
	assert.Equal(t, []int32{0}, f.changes)

	// With a delay, the message stays hidden for that long.
	f = newFake()
	f.send("a", nil, nil)
	r = recorder{err: func(string, int) error { return errors.New("no") }}
	c.RetryDelay = 90 * time.Second
	require.NoError(t, runUntilIdle(c, f, r.handle))
	assert.Len(t, r.seen(), 1)
	n, hidden := f.live()
	assert.Equal(t, 1, n, "not deleted")
	assert.Equal(t, 1, hidden)
	assert.Equal(t, []int32{90}, f.changes)
}

func TestRunIDSources(t *testing.T) {
	attr := map[string]types.MessageAttributeValue{
		"idem-id": {DataType: aws.String("String"), StringValue: aws.String("order-7")},
	}
	system := map[string]string{"MessageDeduplicationId": "dedup-7"}
	tests := []struct {
		name string
		give sqsinbox.Consumer
		want string
	}{
		{"message id", sqsinbox.Consumer{}, "sqs-0001"},
		{"attribute", sqsinbox.Consumer{IDAttribute: "idem-id"}, "order-7"},
		{"deduplication id", sqsinbox.Consumer{DeduplicationID: true}, "dedup-7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFake()
			f.send("a", attr, system)
			var r recorder
			c := tt.give
			c.QueueURL = queueURL
			require.NoError(t, runUntilIdle(&c, f, r.handle))
			assert.Equal(t, []string{tt.want}, r.seen())
		})
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	var r recorder
	ctx := context.Background()
	f := newFake()
	assert.Error(t, (&sqsinbox.Consumer{}).Run(ctx, f, r.handle), "no queue")
	assert.Error(t, (&sqsinbox.Consumer{QueueURL: queueURL, IDAttribute: "x", DeduplicationID: true}).Run(ctx, f, r.handle))
	assert.Error(t, (&sqsinbox.Consumer{QueueURL: queueURL}).Run(ctx, f, nil))
}

// A message without the id attribute is never handled and never deleted.
func TestRunNoID(t *testing.T) {
	t.Run("redrive", func(t *testing.T) {
		f := newFake()
		f.send("no id", nil, nil)
		f.send("has id", map[string]types.MessageAttributeValue{
			"idem-id": {DataType: aws.String("String"), StringValue: aws.String("order-1")},
		}, nil)
		var r recorder
		c := &sqsinbox.Consumer{QueueURL: queueURL, IDAttribute: "idem-id"}
		require.NoError(t, runUntilIdle(c, f, r.handle))
		assert.Equal(t, []string{"order-1"}, r.seen(), "the next message is handled")
		n, hidden := f.live()
		assert.Equal(t, 1, n, "the message with no id is still in the queue")
		assert.Equal(t, 1, hidden, "hidden until its visibility ends; the redrive policy counts its receives")
	})
	t.Run("stop", func(t *testing.T) {
		f := newFake()
		f.send("no id", nil, nil)
		f.send("no id either", nil, nil)
		var r recorder
		c := &sqsinbox.Consumer{QueueURL: queueURL, IDAttribute: "idem-id", NoID: sqsinbox.NoIDStop}
		err := c.Run(context.Background(), f, r.handle)
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		assert.Empty(t, r.seen())
		n, hidden := f.live()
		assert.Equal(t, 2, n, "nothing deleted")
		assert.Zero(t, hidden, "both visible again at once: the first, and the one received with it")
	})
}

// A lost delete (a crash, a network error after the commit) leaves the
// message to come back; OnSettleError hears of it.
func TestRunLostDeleteComesBack(t *testing.T) {
	f := newFake()
	id := f.send("a", nil, nil)
	f.failDeletes = 1
	var settle []error
	var r recorder
	c := &sqsinbox.Consumer{QueueURL: queueURL, OnSettleError: func(mid string, err error) {
		assert.Equal(t, id, mid)
		settle = append(settle, err)
	}}
	require.NoError(t, runUntilIdle(c, f, r.handle))
	require.Len(t, settle, 1)
	n, hidden := f.live()
	assert.Equal(t, 1, n)
	assert.Equal(t, 1, hidden)

	f.expire() // its visibility timeout ends
	require.NoError(t, runUntilIdle(c, f, r.handle))
	assert.Equal(t, []string{id, id}, r.seen(), "received again with the same MessageId: the inbox's to turn away")
	n, _ = f.live()
	assert.Zero(t, n)
}

// While a handler runs longer than a third of the visibility timeout, Run
// extends it.
func TestRunExtendsVisibility(t *testing.T) {
	f := newFake()
	f.changed = make(chan int32, 1)
	f.send("slow", nil, nil)
	c := &sqsinbox.Consumer{QueueURL: queueURL, VisibilityTimeout: time.Second}
	var extended int32
	h := func(ctx context.Context, _ *inbox.Message) error {
		select {
		case extended = <-f.changed: // the handler waits for an extension
		case <-time.After(20 * time.Second):
		}
		return nil
	}
	require.NoError(t, runUntilIdle(c, f, h))
	assert.Equal(t, int32(1), extended, "extended by the whole timeout")
	n, _ := f.live()
	assert.Zero(t, n)
}

// When ctx ends, the messages received and not handled become visible
// again at once.
func TestRunCancelReleases(t *testing.T) {
	f := newFake()
	for range 5 {
		f.send("m", nil, nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	h := func(context.Context, *inbox.Message) error {
		calls++
		if calls == 2 {
			cancel()
		}
		return nil
	}
	err := (&sqsinbox.Consumer{QueueURL: queueURL}).Run(ctx, f, h)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 2, calls)
	n, hidden := f.live()
	assert.Equal(t, 3, n, "two deleted: their handlers had returned nil")
	assert.Zero(t, hidden, "the other three released")
}

// A receive error stops Run.
func TestRunReceiveError(t *testing.T) {
	var r recorder
	err := (&sqsinbox.Consumer{QueueURL: queueURL}).Run(context.Background(), failingAPI{}, r.handle)
	assert.ErrorContains(t, err, "sqs: receive")
}

type failingAPI struct{ sqsinbox.API }

func (failingAPI) ReceiveMessage(context.Context, *sqs.ReceiveMessageInput, ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error) {
	return nil, errors.New("access denied")
}
