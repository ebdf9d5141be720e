package rabbitmq_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
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
	errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, Retry: fastRetry}, committed)
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
// rejected to the queue's dead-letter exchange by default and reported
// (hook and log line: never silent), or returned to the queue while Run
// stops with an error naming the queue. (Without the report, the reject
// case's hook got nothing: this test failed.)
func TestNoID(t *testing.T) {
	t.Run("reject", func(t *testing.T) {
		conn := dial(t)
		queue, dlq := newDeadLettered(t, conn, nil)
		publish(t, conn, queue, amqp.Publishing{Body: []byte("no id")}, amqp.Publishing{MessageId: "order-1"})
		got := make(chan string, 2)
		h := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		dead := make(chan inbox.DeadLetter, 2)
		var logs bytes.Buffer
		c := &rabbitmq.Consumer{Queue: queue, OnDeadLetter: func(d inbox.DeadLetter) { dead <- d },
			Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))}
		errc, cancel := runAsync(t, conn, c, h)
		assert.Equal(t, "order-1", <-got, "Run goes on past it")
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
		assert.Empty(t, got)
		require.Len(t, dead, 1)
		d := <-dead
		assert.ErrorIs(t, d.Err, inbox.ErrNoMessageID)
		assert.Equal(t, queue, d.Message.Source)
		assert.Contains(t, d.To, queue)
		assert.Contains(t, logs.String(), "level=ERROR")

		ch := channel(t, conn)
		dl, ok, err := ch.Get(dlq, true)
		require.NoError(t, err)
		require.True(t, ok, "dead-lettered")
		assert.Equal(t, "no id", string(dl.Body))
		assert.Contains(t, dl.Headers, "x-death")
	})
	t.Run("stop", func(t *testing.T) {
		conn := dial(t)
		queue := newQueue(t, conn, nil)
		publish(t, conn, queue, amqp.Publishing{Body: []byte("no id")}, amqp.Publishing{MessageId: "order-1"})
		var calls atomic.Int32
		h := func(context.Context, *inbox.Message) error { calls.Add(1); return nil }
		errc, _ := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, NoID: rabbitmq.NoIDStop}, h)
		err := testenv.Wait(t, errc)
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		assert.ErrorContains(t, err, queue, "the error names the queue")
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

// fastRetry redelivers failed deliveries after 10 ms, for tests about
// something else.
var fastRetry = inbox.Retry{Delay: 10 * time.Millisecond}

// Cancelling Run while a handler runs requeues the delivery under every
// setting, and never dead-letters it: not with MaxDeliveries 1 (which used
// to be RejectOnError, and rejected it: the broker discards a rejected
// message when the queue has no dead-letter exchange), not without a
// processing limit. A handler that still returns nil after the
// cancellation has committed: its delivery is acked. (With Run treating
// the shutdown's error as a handler failure, the MaxDeliveries 1 case
// dead-lettered the message: this test failed.)
func TestShutdownRequeues(t *testing.T) {
	tests := []struct {
		name      string
		give      rabbitmq.Consumer
		returnNil bool
		wantReady int
	}{
		{name: "default", wantReady: 1},
		{name: "one delivery", give: rabbitmq.Consumer{Retry: inbox.Retry{MaxDeliveries: 1}}, wantReady: 1},
		{name: "no processing limit", give: rabbitmq.Consumer{ProcessingLimit: -1}, wantReady: 1},
		{name: "committed before the end", give: rabbitmq.Consumer{Retry: inbox.Retry{MaxDeliveries: 1}}, returnNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			queue, dlq := newDeadLettered(t, conn, nil)
			publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
			started := make(chan struct{})
			h := func(ctx context.Context, _ *inbox.Message) error {
				close(started)
				<-ctx.Done()
				if tt.returnNil {
					return nil
				}
				return ctx.Err()
			}
			var dead atomic.Int32
			c := tt.give
			c.Queue = queue
			c.OnDeadLetter = func(inbox.DeadLetter) { dead.Add(1) }
			errc, cancel := runAsync(t, conn, &c, h)
			<-started
			cancel()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			// The broker requeues once it has processed the nack, which
			// Run does not wait for.
			require.Eventually(t, func() bool { return ready(t, conn, queue) == tt.wantReady }, 10*time.Second, 10*time.Millisecond)
			assert.Zero(t, ready(t, conn, dlq), "never dead-lettered")
			assert.Zero(t, dead.Load())
		})
	}
}

// A handler that always fails: its message is delivered MaxDeliveries
// times, each redelivery later than the one before by at least the
// Retry's growing delay, then rejected to the queue's dead-letter
// exchange and reported, once, through OnDeadLetter and a log line. A
// healthy message behind it is handled while it waits. (With the delay
// taken out, the nack at once, the gaps were a few milliseconds: this
// test failed; with no limit, nothing reached the dead-letter queue.)
func TestPoisonDeadLettered(t *testing.T) {
	conn := dial(t)
	queue, dlq := newDeadLettered(t, conn, nil)
	publish(t, conn, queue, amqp.Publishing{MessageId: "poison", Body: []byte("bad")}, amqp.Publishing{MessageId: "ok-1"})
	retry := inbox.Retry{Delay: 200 * time.Millisecond, MaxDelay: time.Second, MaxDeliveries: 3}

	poison := &testenv.PoisonHandler{Poison: "poison"}
	h := poison.Handle
	dead := make(chan inbox.DeadLetter, 2)
	var logs bytes.Buffer
	c := &rabbitmq.Consumer{Queue: queue, Retry: retry, Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil)),
		OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}
	errc, cancel := runAsync(t, conn, c, h)
	var d inbox.DeadLetter
	select {
	case d = <-dead:
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("never dead-lettered")
	}
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)

	poison.AssertRedeliveries(t, retry, 3)
	assert.Equal(t, []string{"poison", "ok-1"}, poison.Order()[:2], "the healthy message did not wait behind the poison")
	assert.Equal(t, 3, d.Deliveries)
	assert.Equal(t, "poison", d.Message.ID)
	assert.ErrorContains(t, d.Err, "cannot parse")
	assert.Contains(t, logs.String(), "giving up")
	assert.Contains(t, logs.String(), "id=poison")
	assert.Empty(t, dead, "reported once")

	ch := channel(t, conn)
	got, ok, err := ch.Get(dlq, true)
	require.NoError(t, err)
	require.True(t, ok, "in the dead-letter queue")
	assert.Equal(t, "bad", string(got.Body))
	assert.Contains(t, got.Headers, "x-death")
	assert.Zero(t, ready(t, conn, queue))
}

// A poison message is counted by the inbox's ledger, across Runs and
// restarts, on classic and quorum queues alike: meeting three Runs, one
// failure each, it is dead-lettered by the third's failure, and the
// shutdowns between them count nothing. (With the Runs counting alone, a
// memory ledger each, the third Run saw its first failure and held the
// message again: this test failed.)
func TestPoisonCountsAcrossRuns(t *testing.T) {
	for _, queueType := range []string{"classic", "quorum"} {
		t.Run(queueType, func(t *testing.T) {
			conn := dial(t)
			queue, dlq := newDeadLettered(t, conn, amqp.Table{"x-queue-type": queueType})
			publish(t, conn, queue, amqp.Publishing{MessageId: "poison"})
			ledger, db := newLedger(t, "d2-poison")
			dead := make(chan inbox.DeadLetter, 1)
			for run := 1; run <= 3; run++ {
				failed := make(chan struct{}, 1)
				h := func(context.Context, *inbox.Message) error {
					failed <- struct{}{}
					return errors.New("poison")
				}
				c := &rabbitmq.Consumer{Queue: queue, Ledger: ledger, Retry: inbox.Retry{Delay: time.Hour, MaxDeliveries: 3},
					OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}
				errc, cancel := runAsync(t, conn, c, h)
				select {
				case <-failed:
				case err := <-errc:
					t.Fatalf("run %d: %v", run, err)
				case <-time.After(30 * time.Second):
					t.Fatalf("run %d: no delivery", run)
				}
				if run == 3 {
					select {
					case d := <-dead:
						assert.Equal(t, 3, d.Deliveries, "failed runs")
					case <-time.After(10 * time.Second):
						t.Fatal("the third failure was not dead-lettered")
					}
				} else {
					// A shutdown as the handler fails counts nothing: wait
					// for the failure to be counted first.
					require.Eventually(t, func() bool { return failures(t, db) == run }, 10*time.Second, 10*time.Millisecond)
				}
				// Held for an hour; the shutdown requeues it, counted by a
				// quorum queue, never by the ledger.
				cancel()
				require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
				require.Eventually(t, func() bool { return ready(t, conn, queue)+ready(t, conn, dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
			}
			assert.Equal(t, 1, ready(t, conn, dlq))
			assert.Zero(t, ready(t, conn, queue))
		})
	}
}

// newLedger returns the ledger of a new inbox in a schema of its own, for
// consumer, and its database.
func newLedger(t *testing.T, consumer string) (*inbox.SQLLedger, *sql.DB) {
	t.Helper()
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	return in.Ledger(consumer), db
}

// failures returns the failed runs the ledger in db counts, all messages
// together.
func failures(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT coalesce(sum(failures), 0) FROM idemhttp_inbox_ledger").Scan(&n))
	return n
}

// Issue 30 §3.9. On a quorum queue, deliveries that were handed back
// without running (taken ahead by consumers that closed, as a prefetch at
// shutdown is) and shutdowns while the handler ran all raise the queue's
// x-delivery-count, and none of them counts toward the dead-letter limit:
// the message then runs, and is acked. (With Run deciding from
// x-delivery-count, as it did, the message was dead-lettered on arrival
// without running: this test failed.)
func TestHandedBackNeverCounts(t *testing.T) {
	conn := dial(t)
	queue, dlq := newDeadLettered(t, conn, amqp.Table{"x-queue-type": "quorum"})
	publish(t, conn, queue, amqp.Publishing{MessageId: "healthy"})
	for range 3 { // taken ahead and handed back, unrun
		ch, err := conn.Channel()
		require.NoError(t, err)
		require.NoError(t, ch.Qos(1, 0, false))
		deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
		require.NoError(t, err)
		select {
		case <-deliveries:
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
		}
		require.NoError(t, ch.Close()) // unacked: back to the queue, counted by it
	}
	ledger, _ := newLedger(t, "d2-handback")
	retry := inbox.Retry{MaxDeliveries: 2}
	var dead atomic.Int32
	onDead := func(inbox.DeadLetter) { dead.Add(1) }
	for range 3 { // shutdowns while the handler runs
		started := make(chan struct{})
		h := func(ctx context.Context, _ *inbox.Message) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		}
		errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, Ledger: ledger, Retry: retry, OnDeadLetter: onDead}, h)
		select {
		case <-started:
		case err := <-errc:
			t.Fatalf("Run: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("no delivery: dead-lettered?")
		}
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
		require.Eventually(t, func() bool { return ready(t, conn, queue) == 1 }, 10*time.Second, 10*time.Millisecond)
	}
	done := make(chan string, 1)
	errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, Ledger: ledger, Retry: retry, OnDeadLetter: onDead},
		func(_ context.Context, m *inbox.Message) error { done <- m.ID; return nil })
	select {
	case id := <-done:
		assert.Equal(t, "healthy", id)
	case <-time.After(15 * time.Second):
		t.Fatal("the message never ran")
	}
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Zero(t, dead.Load(), "never dead-lettered")
	assert.Zero(t, ready(t, conn, dlq))
	assert.Zero(t, ready(t, conn, queue), "acked")
}

// Issue 30 §3.9. A hung handler passes its processing limit: its message
// and the healthy one the broker had sent ahead go back (both counted by
// a quorum queue). The hung one's failure is counted, so it is
// dead-lettered on its next arrival (MaxDeliveries 1); the healthy one is
// not dragged with it: it runs on the other consumer, once. (With Run
// deciding from x-delivery-count, the healthy message arrived counted
// once and was dead-lettered unrun: this test failed.)
func TestHungNeighbourDoesNotDrag(t *testing.T) {
	conn := dial(t)
	queue, dlq := newDeadLettered(t, conn, amqp.Table{"x-queue-type": "quorum"})
	publish(t, conn, queue, amqp.Publishing{MessageId: "hung"}, amqp.Publishing{MessageId: "healthy"})
	ledger, _ := newLedger(t, "d2-hung")
	retry := inbox.Retry{MaxDeliveries: 1}
	unblock := make(chan struct{})
	defer close(unblock)
	hung := make(chan struct{}, 1)
	errA, cancelA := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, Prefetch: 2, Ledger: ledger, Retry: retry, ProcessingLimit: 200 * time.Millisecond},
		func(_ context.Context, m *inbox.Message) error {
			if m.ID == "hung" {
				hung <- struct{}{}
				<-unblock // ignores its context
			}
			return nil
		})
	select {
	case <-hung:
	case <-time.After(15 * time.Second):
		t.Fatal("no delivery")
	}
	ran := make(chan string, 2)
	dead := make(chan inbox.DeadLetter, 2)
	errB, cancelB := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, Ledger: ledger, Retry: retry,
		OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }},
		func(_ context.Context, m *inbox.Message) error { ran <- m.ID; return nil })
	for range 2 {
		select {
		case d := <-dead:
			assert.Equal(t, "hung", d.Message.ID)
			assert.ErrorIs(t, d.Err, inbox.ErrExhausted)
		case id := <-ran:
			assert.Equal(t, "healthy", id)
		case <-time.After(15 * time.Second):
			t.Fatal("the two messages were not settled")
		}
	}
	require.Eventually(t, func() bool { return ready(t, conn, queue) == 0 && ready(t, conn, dlq) == 1 }, 10*time.Second, 10*time.Millisecond)
	cancelB()
	require.ErrorIs(t, testenv.Wait(t, errB), context.Canceled)
	assert.Empty(t, ran, "the healthy message ran once, the hung one never again")
	assert.Empty(t, dead, "only the hung one")
	unblock <- struct{}{}
	cancelA()
	require.ErrorIs(t, testenv.Wait(t, errA), context.Canceled, "the late return acks nothing")
}

// Each delivery's IDSpace is its queue, so that two queues carrying
// different messages under the same id both run through one inbox; two
// consumers that declare one IDSpace share it. (With the adapter leaving
// IDSpace empty, the second queue's order-1 was a duplicate: the first
// case failed.)
func TestIDSpace(t *testing.T) {
	tests := []struct {
		name    string
		idSpace string
		want    int
	}{
		{name: "per queue", want: 2},
		{name: "declared shared", idSpace: "orders", want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := dial(t)
			db, _ := testenv.EffectsDB(t, "d2_")
			in := &inbox.SQL{DB: db}
			require.NoError(t, in.Migrate(context.Background()))
			h := in.Handle("d2-spaces", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
				return testenv.InsertEffect(ctx, tx, m.IDSpace+"/"+m.ID)
			})
			var handled atomic.Int32
			count := func(ctx context.Context, m *inbox.Message) error {
				err := h(ctx, m)
				if err == nil {
					handled.Add(1)
				}
				return err
			}
			for range 2 {
				queue := newQueue(t, conn, nil)
				publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
				errc, cancel := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, IDSpace: tt.idSpace}, count)
				require.Eventually(t, func() bool { return ready(t, conn, queue) == 0 && handled.Load() > 0 }, 10*time.Second, 10*time.Millisecond)
				cancel()
				require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
				handled.Store(0)
			}
			rows, _ := testenv.Effects(t, db)
			assert.Equal(t, tt.want, rows)
		})
	}
}

// A handler that hangs, ignoring its context, holds its delivery only
// until the processing limit: then the delivery is requeued, another
// consumer gets it and commits its effect through the inbox, and the
// hung handler's late return acks nothing (an ack of the requeued tag
// would close the channel). (Without the release at the limit, the
// second consumer never got the message: this test failed.)
func TestProcessingLimit(t *testing.T) {
	conn := dial(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	queue := newQueue(t, conn, nil)
	effect := in.Handle("d2-limit", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		return testenv.InsertEffect(ctx, tx, m.ID)
	})

	hung := make(chan struct{})
	unblock := make(chan struct{})
	stuck := func(context.Context, *inbox.Message) error {
		close(hung)
		<-unblock // ignores its context
		return nil
	}
	errA, cancelA := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue, ProcessingLimit: 300 * time.Millisecond}, stuck)
	publish(t, conn, queue, amqp.Publishing{MessageId: "order-1"})
	<-hung
	done := make(chan string, 1)
	errB, cancelB := runAsync(t, conn, &rabbitmq.Consumer{Queue: queue}, func(ctx context.Context, m *inbox.Message) error {
		err := effect(ctx, m)
		if err == nil {
			done <- m.ID
		}
		return err
	})
	select {
	case id := <-done:
		assert.Equal(t, "order-1", id)
	case err := <-errB:
		t.Fatalf("Run: %v", err)
	case <-time.After(15 * time.Second):
		t.Error("the hung handler's delivery never reached the other consumer")
	}
	close(unblock)
	cancelB()
	require.ErrorIs(t, testenv.Wait(t, errB), context.Canceled)
	cancelA()
	require.ErrorIs(t, testenv.Wait(t, errA), context.Canceled, "no ack of the requeued delivery, so no channel error")
	rows, _ := testenv.Effects(t, db)
	assert.Equal(t, 1, rows)
	assert.Zero(t, ready(t, conn, queue))
}

// syncWriter serialises writes to w, for a logger shared with Run's
// goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
