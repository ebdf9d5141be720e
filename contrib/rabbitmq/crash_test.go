package rabbitmq_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// The crash test's child process reads its settings from these variables.
const (
	childEnv      = "D2_RMQ_CHILD" // "inbox" or "naive"
	childDSN      = "D2_RMQ_DSN"
	childQueue    = "D2_RMQ_QUEUE"
	childCrashAt  = "D2_RMQ_CRASH_AFTER"
	crashConsumer = "d2-crash"
)

// TestCrashBeforeAck kills a consumer process with SIGKILL after a
// message's effect committed and before its ack, again and again at
// random points, over 1,000 messages, restarting it each time; then a
// last consumer drains every redelivery. With the inbox every message's
// effect is in the table exactly once. A naive consumer (the same loop
// and the same crashes, with the effect committed on its own and no
// inbox) shows the duplicates each crash makes: that half is the check
// that the test can fail, and fails when the inbox is taken out.
func TestCrashBeforeAck(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: a few seconds")
	}
	const total = 1000
	for _, mode := range []string{"inbox", "naive"} {
		t.Run(mode, func(t *testing.T) {
			conn := dial(t)
			db, schema := testenv.EffectsDB(t, "d2_")
			if mode == "inbox" {
				require.NoError(t, (&inbox.SQL{DB: db}).Migrate(context.Background()))
			}
			queue := newQueue(t, conn, nil)
			msgs := make([]amqp.Publishing, total)
			for i := range msgs {
				msgs[i] = amqp.Publishing{MessageId: testenv.MsgID(i), Body: []byte(testenv.MsgID(i))}
			}
			publish(t, conn, queue, msgs...)
			// Crash after 1 to 150 effects, before that one's ack.
			crashes := testenv.CrashUntilDone(t, db, total, 150, func(crashAfter int) {
				runChild(t, mode, schema, queue, crashAfter, db, total)
			})
			// The last consumer: every delivery the crashes left
			// unacknowledged is redelivered before a marker published
			// after them, which stops it.
			drain(t, conn, db, queue, mode)
			testenv.AssertEffects(t, mode, db, total, crashes)
		})
	}
}

// runChild runs a consumer process that kills itself after crashAfter
// effects, or that this process kills once every message has an effect,
// and waits for it to die.
func runChild(t *testing.T, mode string, schema *testenv.Schema, queue string, crashAfter int, db *sql.DB, total int) {
	t.Helper()
	killed := testenv.RunChild(t, []string{
		childEnv + "=" + mode, childDSN + "=" + schema.URL, childQueue + "=" + queue,
		childCrashAt + "=" + strconv.Itoa(crashAfter),
	}, func() bool {
		// The last child: everything is done before its crash point.
		_, distinct := testenv.Effects(t, db)
		return distinct == total
	})
	require.True(t, killed, "the child dies only by SIGKILL")
}

// childMain is the consumer process of TestCrashBeforeAck.
func childMain() int {
	crashAfter, err := strconv.Atoi(os.Getenv(childCrashAt))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	conn, err := amqp.Dial(os.Getenv(testenv.AMQPEnv))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return testenv.ChildFailed(err)
	}
	db, err := sql.Open("pgx", os.Getenv(childDSN))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	if os.Getenv(childEnv) == "killer" {
		// A consumer that dies in the handler of the message "killer", with
		// the inbox's ledger.
		c := &rabbitmq.Consumer{Queue: os.Getenv(childQueue), Ledger: (&inbox.SQL{DB: db}).Ledger(crashConsumer), Retry: killerRetry}
		return testenv.ChildFailed(c.Run(context.Background(), ch, func(_ context.Context, m *inbox.Message) error {
			if m.ID == "killer" {
				testenv.Die()
			}
			return nil
		}))
	}
	h := testenv.DieAfter(crashAfter, testenv.EffectHandler(os.Getenv(childEnv), db, crashConsumer))
	c := &rabbitmq.Consumer{Queue: os.Getenv(childQueue)}
	return testenv.ChildFailed(c.Run(context.Background(), ch, h))
}

// killerRetry is the Retry of TestKillerMessageDeadLettered's consumers.
var killerRetry = inbox.Retry{MaxDeliveries: 2}

// Issue 30 §3.9: a crash while the handler runs counts. A message that
// kills every consumer that runs it (three children SIGKILLed in its
// handler) is dead-lettered on arrival by the next, from the inbox's
// ledger, without running again: its first delivery is not counted (no
// run is marked before the broker says it may be a redelivery), the
// next two are. (With no ledger, or the runs that never ended left out
// of the count, the handler ran a fourth time: this test failed.)
func TestKillerMessageDeadLettered(t *testing.T) {
	conn := dial(t)
	db, schema := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	queue, dlq := newDeadLettered(t, conn, nil)
	publish(t, conn, queue, amqp.Publishing{MessageId: "killer"})
	for range 3 {
		killed := testenv.RunChild(t, []string{childEnv + "=killer", childDSN + "=" + schema.URL, childQueue + "=" + queue, childCrashAt + "=0"}, nil)
		require.True(t, killed, "the child died in the handler")
	}
	var calls atomic.Int32
	dead := make(chan inbox.DeadLetter, 1)
	c := &rabbitmq.Consumer{Queue: queue, Ledger: in.Ledger(crashConsumer), Retry: killerRetry, OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}
	errc, cancel := runAsync(t, conn, c, func(context.Context, *inbox.Message) error { calls.Add(1); return nil })
	select {
	case d := <-dead:
		assert.ErrorIs(t, d.Err, inbox.ErrExhausted)
		assert.Equal(t, 2, d.Deliveries, "two counted crashes")
	case <-time.After(30 * time.Second):
		t.Fatal("not dead-lettered")
	}
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Zero(t, calls.Load(), "never ran again")
	require.Eventually(t, func() bool { return ready(t, conn, dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
}

// drain consumes queue until a marker published after every redelivery
// of the crashes, running the same effect as the children.
func drain(t *testing.T, conn *amqp.Connection, db *sql.DB, queue, mode string) {
	t.Helper()
	// Wait for the broker to see the last child's connection gone (and
	// so requeue its deliveries) before the marker goes in behind them.
	ch := channel(t, conn)
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		return err == nil && q.Consumers == 0
	}, 30*time.Second, 10*time.Millisecond)
	publish(t, conn, queue, amqp.Publishing{MessageId: "end"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	effect := testenv.EffectHandler(mode, db, crashConsumer)
	h := func(ctx context.Context, m *inbox.Message) error {
		if m.ID == "end" {
			cancel()
			return nil
		}
		return effect(ctx, m)
	}
	err := (&rabbitmq.Consumer{Queue: queue}).Run(ctx, channel(t, conn), h)
	require.ErrorIs(t, err, context.Canceled)
	assert.Zero(t, ready(t, conn, queue), "drained")
}
