package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
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

// runAsync runs c on a new channel of conn in a goroutine and returns its
// result channel and the function that stops it.
func runAsync(t *testing.T, conn *amqp.Connection, c *rabbitmq.Consumer, h inbox.Handler) (<-chan error, context.CancelFunc) {
	t.Helper()
	ch := channel(t, conn)
	return testenv.Go(t, func(ctx context.Context) error { return c.Run(ctx, ch, h) })
}

// A handler error nacks with requeue: the message comes back and the
// handler runs again. Through the inbox, the failed attempt's row rolled
// back with its effect, so the second attempt is not a duplicate. (With
// Run acking before the handler, this test and the connection-closed one
// below fail: checked once.)
func TestHandlerErrorRedelivers(t *testing.T) {
	conn := dial(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	queue := newQueue(t, conn, nil)
	publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})

	var calls atomic.Int32
	done := make(chan *inbox.Message, 1)
	h := in.Handle("d2-error", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.ID); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("the payment API said 503")
		}
		return nil
	})
	committed := func(ctx context.Context, m *inbox.Message) error {
		err := h(ctx, m)
		if err == nil {
			done <- m
		}
		return err
	}
	errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue}, committed)
	select {
	case m := <-done:
		assert.True(t, m.Redelivered, "the broker marks the requeued delivery")
		assert.Equal(t, queue, m.Source)
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no redelivery in 30 s")
	}
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Equal(t, int32(2), calls.Load())
	rows, _ := testenv.Effects(t, db)
	assert.Equal(t, 1, rows, "the first attempt's effect rolled back")
	assert.Zero(t, ready(t, conn, queue), "acked after the second attempt")
}

func TestMessageIDFromHeader(t *testing.T) {
	conn := dial(t)
	queue := newQueue(t, conn, nil)
	publish(t, conn, queue,
		// A header of another type is no id: rejected, never handled.
		amqp.Publishing{MessageId: "property", Headers: amqp.Table{"idem-id": int64(8)}},
		amqp.Publishing{MessageId: "property", Headers: amqp.Table{"idem-id": "order-9", "n": int32(3)}},
		amqp.Publishing{MessageId: "property", Headers: amqp.Table{"idem-id": []byte("order-10")}},
	)
	got := make(chan *inbox.Message, 3)
	h := func(_ context.Context, m *inbox.Message) error { got <- m; return nil }
	errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, IDHeader: "idem-id"}, h)
	m := <-got
	assert.Equal(t, "order-9", m.ID)
	assert.Equal(t, []string{"order-9"}, m.Header["idem-id"])
	assert.IsType(t, amqp.Delivery{}, m.Raw)
	assert.Equal(t, "order-10", (<-got).ID)
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Empty(t, got)
	assert.Zero(t, ready(t, conn, queue))
}

// A delivery with no id is never passed to the handler and never acked:
// rejected to the queue's dead-letter exchange by default, or returned to
// the queue while Run stops.
func TestNoID(t *testing.T) {
	t.Run("reject", func(t *testing.T) {
		conn := dial(t)
		dlq := newQueue(t, conn, nil)
		queue := newQueue(t, conn, amqp.Table{
			"x-dead-letter-exchange":    "",
			"x-dead-letter-routing-key": dlq,
		})
		publish(t, conn, queue, amqp.Publishing{Body: []byte("no id")}, amqp.Publishing{MessageId: "order-1"})
		got := make(chan string, 2)
		h := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue}, h)
		assert.Equal(t, "order-1", <-got, "Run goes on past it")
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
		assert.Empty(t, got)

		ch := channel(t, conn)
		d, ok, err := ch.Get(dlq, true)
		require.NoError(t, err)
		require.True(t, ok, "dead-lettered")
		assert.Equal(t, "no id", string(d.Body))
		assert.Contains(t, d.Headers, "x-death")
	})
	t.Run("stop", func(t *testing.T) {
		conn := dial(t)
		queue := newQueue(t, conn, nil)
		publish(t, conn, queue, amqp.Publishing{Body: []byte("no id")}, amqp.Publishing{MessageId: "order-1"})
		var calls atomic.Int32
		h := func(context.Context, *inbox.Message) error { calls.Add(1); return nil }
		errc, _ := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, NoID: rabbitmq.NoIDStop}, h)
		require.ErrorIs(t, testenv.Wait(t, errc), inbox.ErrNoMessageID)
		assert.Zero(t, calls.Load())
		assert.Equal(t, 2, ready(t, conn, queue), "both back in the queue, the one sent ahead too")
	})
}

// Cancelling ctx returns the deliveries sent ahead of the handler to the
// queue at once, and leaves no goroutine behind (goleak).
func TestCancelRequeuesPrefetched(t *testing.T) {
	conn := dial(t)
	queue := newQueue(t, conn, nil)
	msgs := make([]amqp.Publishing, 10)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: testenv.MsgID(i)}
	}
	publish(t, conn, queue, msgs...)
	ch := channel(t, conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls int
	h := func(context.Context, *inbox.Message) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return nil
	}
	err := (&rabbitmq.Consumer{Queue: queue, Prefetch: 10}).Run(ctx, ch, h)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 3, calls)
	assert.Equal(t, 7, ready(t, conn, queue), "three acked, seven requeued")
	assert.False(t, ch.IsClosed(), "the caller's channel is left open")
}

func TestChannelClosed(t *testing.T) {
	t.Run("connection closed in the handler", func(t *testing.T) {
		conn := dial(t)
		queue := newQueue(t, conn, nil)
		publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
		own, err := amqp.Dial(testenv.Server(t, testenv.AMQPEnv))
		require.NoError(t, err)
		ch, err := own.Channel()
		require.NoError(t, err)
		h := func(context.Context, *inbox.Message) error {
			_ = own.Close() // the ack after this cannot be sent
			return nil
		}
		err = (&rabbitmq.Consumer{Queue: queue}).Run(context.Background(), ch, h)
		require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
		require.Eventually(t, func() bool { return ready(t, conn, queue) == 1 }, 10*time.Second, 10*time.Millisecond,
			"the unacked delivery went back to the queue")
	})
	t.Run("channel exception", func(t *testing.T) {
		conn := dial(t)
		queue := newQueue(t, conn, nil)
		publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
		ch := channel(t, conn)
		h := func(context.Context, *inbox.Message) error {
			// Acking an unknown delivery tag is a channel error (406
			// PRECONDITION_FAILED): the broker closes the channel.
			_ = ch.Ack(999, false)
			return nil
		}
		err := (&rabbitmq.Consumer{Queue: queue}).Run(context.Background(), ch, h)
		require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
	})
	t.Run("queue deleted", func(t *testing.T) {
		conn := dial(t)
		queue := newQueue(t, conn, nil)
		started := make(chan struct{})
		var once sync.Once
		h := func(context.Context, *inbox.Message) error { once.Do(func() { close(started) }); return nil }
		errc, _ := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue}, h)
		publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
		<-started
		_, err := channel(t, conn).QueueDelete(queue, false, false, false)
		require.NoError(t, err)
		require.ErrorIs(t, testenv.Wait(t, errc), rabbitmq.ErrConsumerCancelled)
	})
	t.Run("no such queue", func(t *testing.T) {
		conn := dial(t)
		ch := channel(t, conn)
		h := func(context.Context, *inbox.Message) error { return nil }
		err := (&rabbitmq.Consumer{Queue: "d2-missing-" + testenv.RandomHex(4)}).Run(context.Background(), ch, h)
		require.ErrorIs(t, err, rabbitmq.ErrChannelClosed)
		assert.ErrorContains(t, err, "NOT_FOUND")
	})
}

// Two consumers on one queue, every message published twice (a
// producer's retry after a lost confirm): each message's effect happens
// once, whichever consumer gets which copy, at the same moment or not.
func TestTwoConsumersDuplicatePublishes(t *testing.T) {
	conn := dial(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	queue := newQueue(t, conn, nil)
	const n = 200
	var msgs []amqp.Publishing
	for i := range n {
		p := amqp.Publishing{MessageId: testenv.MsgID(i)}
		msgs = append(msgs, p, p)
	}
	publish(t, conn, queue, msgs...)

	var handled atomic.Int32
	all := make(chan struct{})
	h := in.Handle("d2-two", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.ID)
		return err
	})
	count := func(ctx context.Context, m *inbox.Message) error {
		err := h(ctx, m)
		if err == nil && handled.Add(1) == 2*n {
			close(all)
		}
		return err
	}
	c := &rabbitmq.Consumer{Queue: queue, Prefetch: 8}
	errc1, cancel1 := runAsync(t, conn, c, count)
	errc2, cancel2 := runAsync(t, conn, c, count)
	select {
	case <-all:
	case err := <-errc1:
		t.Fatalf("Run: %v", err)
	case err := <-errc2:
		t.Fatalf("Run: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not all copies handled in 60 s")
	}
	cancel1()
	cancel2()
	require.ErrorIs(t, testenv.Wait(t, errc1), context.Canceled)
	require.ErrorIs(t, testenv.Wait(t, errc2), context.Canceled)
	rows, distinct := testenv.Effects(t, db)
	assert.Equal(t, n, rows)
	assert.Equal(t, n, distinct)
}

func TestRunRefusesBadConfig(t *testing.T) {
	conn := dial(t)
	ch := channel(t, conn)
	h := func(context.Context, *inbox.Message) error { return nil }
	assert.Error(t, (&rabbitmq.Consumer{}).Run(context.Background(), ch, h))
	assert.Error(t, (&rabbitmq.Consumer{Queue: "q"}).Run(context.Background(), ch, nil))
}

// With RetryDelay, a failed delivery is requeued after the delay and runs
// again; a ctx done during the delay requeues it at once.
func TestRetryDelay(t *testing.T) {
	conn := dial(t)
	queue := newQueue(t, conn, nil)
	publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
	var calls atomic.Int32
	second := make(chan struct{})
	h := func(context.Context, *inbox.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("database is down")
		}
		close(second)
		return nil
	}
	errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, RetryDelay: 20 * time.Millisecond}, h)
	select {
	case <-second:
	case <-time.After(30 * time.Second):
		t.Fatal("no second attempt")
	}
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)

	// Cancelled during a long delay: Run returns and the delivery is back.
	publish(t, conn, queue, amqp.Publishing{MessageId: "order-2"})
	failed := make(chan struct{})
	h2 := func(context.Context, *inbox.Message) error { close(failed); return errors.New("down") }
	errc, cancel = runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, RetryDelay: time.Hour}, h2)
	<-failed
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	// The broker requeues it once it has processed the nack, which Run
	// does not wait for.
	require.Eventually(t, func() bool { return ready(t, conn, queue) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the delivery is back in the queue")
}
