package rabbitmq_test

import (
	"context"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/testenv"
)

func TestMain(m *testing.M) {
	// The crash tests run this binary again as the consumer they kill.
	testenv.Main(m, childEnv, childMain)
}

// dial opens a connection to the test broker, closed when the test ends.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(testenv.Server(t, testenv.AMQPEnv))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// channel opens a channel on conn, closed when the test ends.
func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// newQueue declares a queue private to the test, deleted when it ends.
// args are its arguments (nil for none).
func newQueue(t testing.TB, conn *amqp.Connection, args amqp.Table) string {
	t.Helper()
	name := "d2-" + testenv.RandomHex(6)
	ch := channel(t, conn)
	// A quorum queue must be durable.
	durable := args["x-queue-type"] == "quorum"
	_, err := ch.QueueDeclare(name, durable, false, false, false, args)
	require.NoError(t, err)
	t.Cleanup(func() {
		// A fresh connection: the test may have closed its own.
		c, err := amqp.Dial(os.Getenv(testenv.AMQPEnv))
		if err != nil {
			return
		}
		defer c.Close()
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
	return name
}

// newDeadLettered declares a dead-letter queue and a queue (with args
// besides, nil for none) whose rejected messages go to it, both private
// to the test, and returns their names.
func newDeadLettered(t testing.TB, conn *amqp.Connection, args amqp.Table) (queue, dlq string) {
	t.Helper()
	dlq = newQueue(t, conn, nil)
	all := amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
	for k, v := range args {
		all[k] = v
	}
	return newQueue(t, conn, all), dlq
}

// publish sends msgs to queue through the default exchange and waits for
// the broker's confirmation of each.
func publish(t testing.TB, conn *amqp.Connection, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.NoError(t, ch.Confirm(false))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, m)
		require.NoError(t, err)
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok, "broker nacked a publish")
	}
}

// ready returns how many messages of queue wait for a consumer (not
// counting those delivered and not yet acknowledged).
func ready(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}
