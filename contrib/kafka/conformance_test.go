package kafka_test

import (
	"context"
	"testing"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// kafkaAdapter is the conformance suite's view of a Consumer on a
// cluster and topic of its own; every Run is a new member of one group.
type kafkaAdapter struct {
	seeds string
}

func (a *kafkaAdapter) Publish(t *testing.T, ids ...string) {
	rs := make([]record, len(ids))
	for i, id := range ids {
		rs[i] = record{id: id}
	}
	produce(t, a.seeds, "conformance", rs)
}

func (a *kafkaAdapter) Run(ctx context.Context, s inboxtest.Settings, h inbox.Handler) error {
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "conformance", Topics: []string{"conformance"}, Handler: h,
		Retry: s.Retry, Ledger: s.Ledger, ProcessingLimit: s.ProcessingLimit,
		// A destination that takes what is dead-lettered, unless the
		// scenario fails it.
		DeadLetter: func(context.Context, *inbox.Message) error {
			if s.DeadLetterFault != nil {
				return s.DeadLetterFault()
			}
			return nil
		},
		OnDeadLetter: s.OnDeadLetter,
	}, groupOpts(a.seeds)...)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Run(ctx)
}

func (a *kafkaAdapter) Unsupported(scenario string) string {
	if scenario == inboxtest.ScenarioHung {
		return "Kafka keeps a partition with its member: past the processing limit a record is a failure, retried there"
	}
	return ""
}

// The adapter is pinned to the model (inboxtest.RunAdapter), on one
// partition.
func TestConformance(t *testing.T) {
	inboxtest.RunAdapter(t, func(t *testing.T) inboxtest.Adapter {
		return &kafkaAdapter{seeds: newCluster(t, "conformance", 1)}
	})
}
