package rabbitmq_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// runs records the deliveries a handler saw, in order.
type runs struct {
	mu   sync.Mutex
	seen []*inbox.Message
}

func (r *runs) add(m *inbox.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, m)
}

func (r *runs) all() []*inbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*inbox.Message(nil), r.seen...)
}

func (r *runs) ids() []string {
	var ids []string
	for _, m := range r.all() {
		ids = append(ids, m.ID)
	}
	return ids
}

// Holding a delivery outside the prefetch means switching subscriptions;
// the deliveries the old one had sent ahead are handled, not handed back
// (a quorum queue would count each return against its delivery-limit,
// and a classic queue would send them again): each healthy message runs
// once, never marked redelivered, while the poison waits out its delay.
// Checked to fail with hold handing back (nack with requeue) what the
// cancelled subscription had sent ahead.
func TestHoldHandsNothingBack(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			conn := dial(t)
			queue := newQueue(t, conn, amqp.Table{"x-queue-type": queueType})
			publish(t, conn, queue, amqp.Publishing{MessageId: "poison"},
				amqp.Publishing{MessageId: "ok-1"}, amqp.Publishing{MessageId: "ok-2"}, amqp.Publishing{MessageId: "ok-3"})
			var seen runs
			sentAhead := make(chan struct{})
			h := func(_ context.Context, m *inbox.Message) error {
				seen.add(m)
				if m.ID != "poison" {
					return nil
				}
				<-sentAhead // fail once the broker sent the others ahead
				return errors.New("cannot parse the order")
			}
			c := &rabbitmq.Consumer{Queue: queue, Prefetch: 4, Logger: slog.New(slog.DiscardHandler),
				Retry: inbox.Retry{Delay: time.Minute, MaxDelay: time.Minute, MaxDeliveries: -1}}
			errc, cancel := runAsync(t, conn, c, h)
			require.Eventually(t, func() bool { return ready(t, conn, queue) == 0 }, 10*time.Second, 10*time.Millisecond)
			close(sentAhead)
			require.Eventually(t, func() bool { return len(seen.all()) >= 4 }, 20*time.Second, 10*time.Millisecond)
			assert.Never(t, func() bool { return len(seen.all()) > 4 }, 300*time.Millisecond, 10*time.Millisecond,
				"a healthy message ran again")
			cancel()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			var ids []string
			for _, m := range seen.all() {
				ids = append(ids, m.ID)
				assert.False(t, m.Redelivered, "%s was handed back", m.ID)
			}
			assert.Equal(t, []string{"poison", "ok-1", "ok-2", "ok-3"}, ids)
			require.Eventually(t, func() bool { return ready(t, conn, queue) == 1 }, 10*time.Second, 10*time.Millisecond,
				"the held poison went back at shutdown")
		})
	}
}

// The held deliveries Run keeps outside its prefetch are capped at
// max(Prefetch, DefaultPrefetch), so a flood of poison cannot grow what
// it holds without end. Past the cap a failed delivery waits out its
// delay in its subscription's slot, with a warning: with Prefetch 1, the
// 33rd failing message stops the consumer (until the earliest delay
// ends), and the messages behind it stay in the queue for other
// consumers. Checked to fail with the cap removed (hold always frees the
// slot): no warning, and the rest of the queue ran.
func TestHeldDeliveriesAreCapped(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			conn := dial(t)
			queue := newQueue(t, conn, amqp.Table{"x-queue-type": queueType})
			const poisons = rabbitmq.DefaultPrefetch + 2
			msgs := make([]amqp.Publishing, 0, poisons+1)
			for i := range poisons {
				msgs = append(msgs, amqp.Publishing{MessageId: fmt.Sprintf("poison-%02d", i)})
			}
			publish(t, conn, queue, append(msgs, amqp.Publishing{MessageId: "healthy"})...)
			var seen runs
			h := func(_ context.Context, m *inbox.Message) error {
				seen.add(m)
				if strings.HasPrefix(m.ID, "poison-") {
					return errors.New("cannot parse the order")
				}
				return nil
			}
			logs := &syncWriter{w: &bytes.Buffer{}}
			c := &rabbitmq.Consumer{Queue: queue, Prefetch: 1, Logger: slog.New(slog.NewTextHandler(logs, nil)),
				Retry: inbox.Retry{Delay: time.Minute, MaxDelay: time.Minute, MaxDeliveries: -1}}
			errc, cancel := runAsync(t, conn, c, h)
			warned := func() bool {
				logs.mu.Lock()
				defer logs.mu.Unlock()
				return strings.Contains(logs.w.String(), "takes a slot until its delay ends")
			}
			capped := assert.Eventually(t, warned, 20*time.Second, 10*time.Millisecond, "no warning past the cap")
			held := rabbitmq.DefaultPrefetch + 1 // the cap, and one in the subscription's only slot
			if capped {
				// Nothing more comes: the one slot is held.
				assert.Never(t, func() bool { return len(seen.all()) > held }, 300*time.Millisecond, 10*time.Millisecond,
					"a delivery ran past the cap")
				assert.Equal(t, poisons+1-held, ready(t, conn, queue), "the rest waits in the queue")
			}
			cancel()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			assert.Len(t, seen.ids(), held)
			assert.NotContains(t, seen.ids(), "healthy")
			require.Eventually(t, func() bool { return ready(t, conn, queue) == poisons+1 }, 10*time.Second, 10*time.Millisecond,
				"every held delivery went back at shutdown")
		})
	}
}
