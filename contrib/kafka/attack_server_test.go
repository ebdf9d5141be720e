package kafka_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
)

// The fresh-eyes attack on the consumer half (issue 30): each test is
// named after the bug it pins.

// TestDeadLetterFailureForgetsTheCount: the core forgot a message's
// ledger record (OpForget) before the adapter's dead-letter verb, which
// for Kafka is a produce (or Config.DeadLetter) that can fail; the record
// was then sought back and, once its pause ended, ran again from a count
// of zero: MaxDeliveries more runs of a poison handler, and for a record
// that kills its process, MaxDeliveries more crashes, before the next
// attempt to dead-letter it. The record now goes only once the adapter
// tells the core (Runner.DeadLettered) that the dead letter is done.
// Checked to fail with settleDead passing nil to Runner.DeadLettered
// whatever the dead letter answered (six runs).
func TestDeadLetterFailureForgetsTheCount(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "poison"}, {id: "ok-1"}})
	var runs, dlAttempts atomic.Int64
	seen := make(chan string, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, Retry: inbox.Retry{Delay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxDeliveries: 3},
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "poison" {
				runs.Add(1)
				return errors.New("cannot parse")
			}
			seen <- m.ID
			return nil
		},
		DeadLetter: func(context.Context, *inbox.Message) error {
			if dlAttempts.Add(1) == 1 {
				return errors.New("dead-letter store down, once")
			}
			return nil
		},
		OnDeadLetter: func(inbox.DeadLetter) {},
	}, groupOpts(seeds)...)
	assert.NoError(t, err)
	stop := run(t, c)
	assert.Equal(t, "ok-1", recv(t, seen))
	stop()
	assert.Equal(t, int64(2), dlAttempts.Load())
	assert.Equal(t, int64(3), runs.Load(), "the poison ran MaxDeliveries times, not again after the dead letter failed")
}

// TestDeadLetterAnswerLostNotRunAgain: a dead letter that landed and
// whose answer was lost (Config.DeadLetter's error after it stored the
// record) keeps the message's count, and the record is sought back. That
// record followed the last one settled, so it did not start a window of
// records that may have been delivered before: it ran again with no
// durable marker, the core never read its count before running it, and a
// handler that succeeded on that run had both its effect and a dead
// letter (internal/msgsim, seed 870). A sought-back record now starts a
// window: it is marked, found exhausted and dead-lettered again, unrun.
// Checked to fail with seek leaving st.next as it was (three runs, the
// third a success).
func TestDeadLetterAnswerLostNotRunAgain(t *testing.T) {
	seeds := newCluster(t, "t", 1)
	produce(t, seeds, "t", []record{{id: "ok-1"}, {id: "flaky"}})
	var runs, dlAttempts atomic.Int64
	var succeeded atomic.Bool
	dead := make(chan string, 10)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "g", Topics: []string{"t"}, MaxPollRecords: 1,
		Retry: inbox.Retry{Delay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxDeliveries: 2},
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "flaky" {
				if runs.Add(1) <= 2 {
					return errors.New("fails twice")
				}
				succeeded.Store(true)
			}
			return nil
		},
		DeadLetter: func(_ context.Context, m *inbox.Message) error {
			dead <- m.ID
			if dlAttempts.Add(1) == 1 {
				return errors.New("stored, and the answer lost")
			}
			return nil
		},
		OnDeadLetter: func(inbox.DeadLetter) {},
	}, groupOpts(seeds)...)
	assert.NoError(t, err)
	stop := run(t, c)
	assert.Equal(t, "flaky", recv(t, dead))
	assert.Equal(t, "flaky", recv(t, dead))
	stop()
	assert.Equal(t, int64(2), runs.Load(), "not run again once its dead letter was decided")
	assert.False(t, succeeded.Load())
}
