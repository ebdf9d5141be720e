package rabbitmq_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// rmqAdapter is the conformance suite's view of a Consumer on a queue of
// its own, with a dead-letter queue.
type rmqAdapter struct {
	conn  *amqp.Connection
	queue string
}

func (a *rmqAdapter) Publish(t *testing.T, ids ...string) {
	msgs := make([]amqp.Publishing, len(ids))
	for i, id := range ids {
		msgs[i] = amqp.Publishing{MessageId: id}
	}
	publish(t, a.conn, a.queue, msgs...)
}

func (a *rmqAdapter) Run(ctx context.Context, s inboxtest.Settings, h inbox.Handler) error {
	ch, err := a.conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	c := &rabbitmq.Consumer{Queue: a.queue, Retry: s.Retry, Ledger: s.Ledger, ProcessingLimit: s.ProcessingLimit,
		Prefetch: s.Prefetch, OnDeadLetter: s.OnDeadLetter}
	return c.Run(ctx, ch, h)
}

func (a *rmqAdapter) Unsupported(scenario string) string {
	if scenario == inboxtest.ScenarioDeadLetterFails {
		return "a reject fails only on a channel that closed; the test cannot close it under the consumer (the core's side is pinned by the model and by Kafka)"
	}
	return ""
}

// The adapter is pinned to the model (inboxtest.RunAdapter): on classic
// and quorum queues, a poison message, shutdowns and a hung neighbour end
// as they do on the modelled broker. (With Run deciding from the quorum
// queue's x-delivery-count, as it did, the shutdown and hung-neighbour
// scenarios dead-lettered a healthy message on quorum queues: this test
// failed.)
func TestConformance(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			inboxtest.RunAdapter(t, func(t *testing.T) inboxtest.Adapter {
				conn := dial(t)
				queue, _ := newDeadLettered(t, conn, amqp.Table{"x-queue-type": queueType})
				return &rmqAdapter{conn: conn, queue: queue}
			})
		})
	}
}
