package rabbitmq_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// The fresh-eyes attack on the consumer half (issue 30): each test is
// named after the bug it pins.

// TestHeldPoisonStallsTheConsumer: Run holds a failed delivery,
// unacknowledged, for its retry delay, and the docs say other deliveries
// go on meanwhile; but a held delivery took a prefetch slot. With
// Prefetch 1 (or as many failing messages as the prefetch), the channel
// got nothing more while it was held, and on a classic queue the requeue
// then put it back at the head, where it was delivered again at once: the
// healthy message behind it waited until the poison was dead-lettered,
// and with no delivery limit (MaxDeliveries < 0), for ever; on a quorum
// queue (requeue at the back), for each delay. Run now holds it outside
// its prefetch (it subscribes again), so the healthy message runs while
// the poison waits out its delay, a minute here: on either queue type,
// the healthy one runs well before the poison's first delay ends.
// Checked to fail, on both queue types, with hold keeping the
// subscription (no cancel), which was the bug; and, on a quorum queue
// with a Tag of the caller's, with Run subscribing again under that tag
// (the queue takes the new consumer for the cancelled one, held delivery
// and all).
func TestHeldPoisonStallsTheConsumer(t *testing.T) {
	for _, tc := range []struct{ queueType, tag string }{
		{"classic", ""}, {"quorum", ""}, {"classic", "orders-worker"}, {"quorum", "orders-worker"},
	} {
		queueType := tc.queueType
		t.Run(queueType+"/tag="+tc.tag, func(t *testing.T) {
			conn := dial(t)
			queue := newQueue(t, conn, amqp.Table{"x-queue-type": queueType})
			publish(t, conn, queue, amqp.Publishing{MessageId: "poison", Body: []byte("bad")}, amqp.Publishing{MessageId: "ok-1"})
			poison := &testenv.PoisonHandler{Poison: "poison"}
			c := &rabbitmq.Consumer{Queue: queue, Tag: tc.tag, Prefetch: 1, Logger: slog.New(slog.DiscardHandler),
				Retry: inbox.Retry{Delay: time.Minute, MaxDelay: time.Minute, MaxDeliveries: -1}}
			errc, cancel := runAsync(t, conn, c, poison.Handle)
			ran := assert.Eventually(t, func() bool { return len(poison.Order()) == 2 }, 20*time.Second, 10*time.Millisecond,
				"the healthy message never ran behind the held poison")
			cancel()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			if ran {
				assert.Equal(t, []string{"poison", "ok-1"}, poison.Order())
			}
			// The held poison went back at shutdown; ok-1 was acked.
			require.Eventually(t, func() bool { return ready(t, conn, queue) == 1 }, 10*time.Second, 10*time.Millisecond)
		})
	}
}
