package nats_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsinbox "github.com/idemkit/idemhttp/contrib/nats"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// natsAdapter is the conformance suite's view of a Consumer on a stream
// and durable consumer of its own.
type natsAdapter struct {
	js jetstream.JetStream
	s  *testStream
	t  *testing.T
}

func (a *natsAdapter) Publish(t *testing.T, ids ...string) { a.s.publish(t, a.js, ids...) }

func (a *natsAdapter) Run(ctx context.Context, s inboxtest.Settings, h inbox.Handler) error {
	c := &natsinbox.Consumer{Retry: s.Retry, Ledger: s.Ledger, ProcessingLimit: s.ProcessingLimit, Batch: s.Prefetch,
		MaxWait: time.Second, OnDeadLetter: s.OnDeadLetter}
	return c.Run(ctx, a.s.cons(a.t, a.js), h)
}

func (a *natsAdapter) Unsupported(scenario string) string {
	if scenario == inboxtest.ScenarioDeadLetterFails {
		return "a term fails only when the connection does; the test cannot fail it under the consumer (the core's side is pinned by the model and by Kafka)"
	}
	return ""
}

// The adapter is pinned to the model (inboxtest.RunAdapter). (With Run
// deciding from NumDelivered, as it did, the shutdown scenario terminated
// the healthy message; with only the hung message naked at the limit, the
// healthy one pulled behind it waited for AckWait: this test failed both
// ways.)
func TestConformance(t *testing.T) {
	inboxtest.RunAdapter(t, func(t *testing.T) inboxtest.Adapter {
		_, js := connect(t)
		return &natsAdapter{js: js, s: newStream(t, js, 30*time.Second), t: t}
	})
}
