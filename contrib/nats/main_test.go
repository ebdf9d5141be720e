package nats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/testenv"
)

func TestMain(m *testing.M) {
	// The crash test runs this binary again as the consumer it kills.
	testenv.Main(m, childEnv, childMain)
}

// connect opens a connection to the test server, closed when the test
// ends, and its JetStream context.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(testenv.Server(t, testenv.NATSEnv))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

// testStream is a stream private to one test, with one durable pull
// consumer, deleted when the test ends.
type testStream struct {
	name     string // stream name
	subject  string // the subject its messages are published on
	consumer string // the durable consumer's name
}

// newStream creates a stream and its consumer with the given AckWait.
func newStream(t testing.TB, js jetstream.JetStream, ackWait time.Duration) *testStream {
	t.Helper()
	return newStreamWith(t, js, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait})
}

// newStreamWith creates a stream and its consumer with the given
// configuration (its Durable set here).
func newStreamWith(t testing.TB, js jetstream.JetStream, cfg jetstream.ConsumerConfig) *testStream {
	t.Helper()
	id := testenv.RandomHex(6)
	s := &testStream{name: "D2_" + strings.ToUpper(id), subject: "d2." + id, consumer: "d2-" + id}
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s.name, Subjects: []string{s.subject}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), s.name) })
	cfg.Durable = s.consumer
	_, err = js.CreateOrUpdateConsumer(ctx, s.name, cfg)
	require.NoError(t, err)
	return s
}

// cons returns a handle on the stream's consumer.
func (s *testStream) cons(t testing.TB, js jetstream.JetStream) jetstream.Consumer {
	t.Helper()
	c, err := js.Consumer(context.Background(), s.name, s.consumer)
	require.NoError(t, err)
	return c
}

// publish publishes a message per id (an empty id: no Nats-Msg-Id) and
// waits for each PubAck.
func (s *testStream) publish(t testing.TB, js jetstream.JetStream, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	futures := make([]jetstream.PubAckFuture, 0, len(ids))
	for _, id := range ids {
		msg := nats.NewMsg(s.subject)
		msg.Data = []byte("body of " + id)
		var opts []jetstream.PublishOpt
		if id != "" {
			opts = append(opts, jetstream.WithMsgID(id))
		}
		f, err := js.PublishMsgAsync(msg, opts...)
		require.NoError(t, err)
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("no PubAck in 30 s")
		}
	}
}

// settled reports whether the consumer has nothing left to deliver and
// nothing delivered and unacknowledged.
func (s *testStream) settled(t testing.TB, js jetstream.JetStream) bool {
	t.Helper()
	info, err := s.cons(t, js).Info(context.Background())
	require.NoError(t, err)
	return info.NumPending == 0 && info.NumAckPending == 0
}
