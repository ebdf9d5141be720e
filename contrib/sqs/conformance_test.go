package sqs_test

import (
	"context"
	"testing"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// sqsAdapter is the conformance suite's view of a Consumer on the fake
// queue, whose redrive policy's maxReceiveCount is the scenario's
// MaxDeliveries.
type sqsAdapter struct {
	f *fakeSQS
}

func (a *sqsAdapter) Publish(_ *testing.T, ids ...string) {
	for _, id := range ids {
		a.f.send(id, nil, map[string]string{})
		a.f.mu.Lock()
		m := a.f.msgs[len(a.f.msgs)-1]
		m.id = id // the MessageId is the scenario's id
		a.f.mu.Unlock()
	}
}

func (a *sqsAdapter) Run(ctx context.Context, s inboxtest.Settings, h inbox.Handler) error {
	a.f.setRedrive(s.Retry.MaxDeliveries)
	c := &sqsinbox.Consumer{QueueURL: queueURL, Retry: s.Retry, Ledger: s.Ledger, ProcessingLimit: s.ProcessingLimit,
		MaxMessages: int32(s.Prefetch), WaitTime: -1, OnDeadLetter: s.OnDeadLetter}
	return c.Run(ctx, a.f, h)
}

func (a *sqsAdapter) Unsupported(scenario string) string {
	switch scenario {
	case inboxtest.ScenarioShutdowns, inboxtest.ScenarioHung:
		return "SQS's redrive policy dead-letters by its own receive count, which every shutdown and release raises (see the package documentation)"
	case inboxtest.ScenarioDeadLetterFails:
		return "the core never dead-letters a message with an id here: SQS's redrive policy moves it, by its own receive count"
	}
	return ""
}

// The adapter is pinned to the model (inboxtest.RunAdapter) where SQS's
// redrive policy lets it be: a poison message beside a healthy one.
func TestConformance(t *testing.T) {
	inboxtest.RunAdapter(t, func(*testing.T) inboxtest.Adapter {
		f := newFake()
		f.realTime = true // the retry delays end by themselves
		return &sqsAdapter{f: f}
	})
}
