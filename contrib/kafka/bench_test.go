package kafka_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
)

// BenchmarkPartitionIsolation measures how long the records of a healthy
// partition wait while another partition's record keeps failing: in
// "one-failing", partition 0 holds a record whose handler always fails,
// retried every 200 ms, while each iteration produces one record to
// partition 1 and waits until its handler has run; "healthy" is the same
// without the failing record. The metrics are the latency from the
// produce call to the handler, median and worst, in milliseconds.
//
//	go test -run '^$' -bench BenchmarkPartitionIsolation -benchtime 200x -count 5 ./contrib/kafka/
func BenchmarkPartitionIsolation(b *testing.B) {
	for _, failing := range []bool{false, true} {
		name := "healthy"
		if failing {
			name = "one-failing"
		}
		b.Run(name, func(b *testing.B) {
			seeds := newCluster(b, "t", 2)
			handled := make(chan time.Time, 1)
			failed := make(chan struct{}, 1)
			c, err := kafka.NewConsumer(kafka.Config{
				Group: "g", Topics: []string{"t"},
				Retry: inbox.Retry{Delay: 200 * time.Millisecond, MaxDelay: 200 * time.Millisecond, MaxDeliveries: -1},
				Handler: func(_ context.Context, m *inbox.Message) error {
					if m.ID == "poison" {
						select {
						case failed <- struct{}{}:
						default:
						}
						return errors.New("cannot parse")
					}
					handled <- time.Now()
					return nil
				},
			}, groupOpts(seeds)...)
			require.NoError(b, err)
			run(b, c)
			producer, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
			require.NoError(b, err)
			defer producer.Close()
			ctx := context.Background()
			send := func(id string, partition int32) time.Time {
				r := &kgo.Record{Partition: partition, Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}
				start := time.Now()
				require.NoError(b, producer.ProduceSync(ctx, r).FirstErr())
				return start
			}
			// The consumer has joined and fetches: one record through.
			send("warm-up", 1)
			<-handled
			if failing {
				send("poison", 0)
				<-failed
			}
			var lat []time.Duration
			for i := 0; b.Loop(); i++ {
				start := send("m-"+strconv.Itoa(i), 1)
				lat = append(lat, (<-handled).Sub(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2])/float64(time.Millisecond), "median-ms")
			b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Millisecond), "worst-ms")
		})
	}
}
