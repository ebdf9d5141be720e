package nats_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	natsinbox "github.com/idemkit/idemhttp/contrib/nats"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// runAsync runs c on cons in a goroutine and returns its result channel
// and the function that stops it.
func runAsync(t *testing.T, c *natsinbox.Consumer, cons jetstream.Consumer, h inbox.Handler) (<-chan error, context.CancelFunc) {
	t.Helper()
	return testenv.Go(t, func(ctx context.Context) error { return c.Run(ctx, cons, h) })
}

// A handler error naks the message: it is redelivered and the handler
// runs again. Through the inbox, the failed attempt's row rolled back with
// its effect, so the second attempt is not a duplicate.
// (With Run acking before the handler, this test fails: checked once.)
func TestHandlerErrorRedelivers(t *testing.T) {
	_, js := connect(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	s := newStream(t, js, 10*time.Second) // a redelivery before that is the nak's doing
	s.publish(t, js, "order-1")

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
	errc, cancel := runAsync(t, &natsinbox.Consumer{NakDelay: 10 * time.Millisecond}, s.cons(t, js), committed)
	select {
	case m := <-done:
		assert.True(t, m.Redelivered)
		assert.Equal(t, s.name+"/"+s.subject, m.Source)
		assert.Equal(t, "body of order-1", string(m.Body))
		assert.Equal(t, []string{"order-1"}, m.Header["Nats-Msg-Id"])
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no redelivery in 30 s")
	}
	require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond, "acked")
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Equal(t, int32(2), calls.Load())
	rows, _ := testenv.Effects(t, db)
	assert.Equal(t, 1, rows, "the first attempt's effect rolled back")
}

func TestMessageIDFromOtherHeader(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, time.Minute)
	m := nats.NewMsg(s.subject)
	m.Header.Set("Idem-Id", "order-9")
	_, err := js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	got := make(chan string, 1)
	h := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
	errc, cancel := runAsync(t, &natsinbox.Consumer{IDHeader: "Idem-Id"}, s.cons(t, js), h)
	assert.Equal(t, "order-9", <-got)
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
}

// A message with no id is never passed to the handler and never acked:
// terminated by default (with an advisory a dead-letter process can act
// on), or naked while Run stops.
func TestNoID(t *testing.T) {
	t.Run("term", func(t *testing.T) {
		nc, js := connect(t)
		s := newStream(t, js, time.Minute)
		advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + s.name + "." + s.consumer)
		require.NoError(t, err)
		s.publish(t, js, "", "order-1")
		got := make(chan string, 2)
		h := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		errc, cancel := runAsync(t, &natsinbox.Consumer{}, s.cons(t, js), h)
		assert.Equal(t, "order-1", <-got, "Run goes on past it")
		_, err = advisories.NextMsg(10 * time.Second)
		require.NoError(t, err, "the server announced the termination")
		require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond,
			"terminated: never redelivered")
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
		assert.Empty(t, got)
	})
	t.Run("stop", func(t *testing.T) {
		_, js := connect(t)
		s := newStream(t, js, 2*time.Second)
		s.publish(t, js, "", "order-1")
		var calls atomic.Int32
		h := func(context.Context, *inbox.Message) error { calls.Add(1); return nil }
		errc, _ := runAsync(t, &natsinbox.Consumer{NoID: natsinbox.NoIDStop}, s.cons(t, js), h)
		require.ErrorIs(t, testenv.Wait(t, errc), inbox.ErrNoMessageID)
		assert.Zero(t, calls.Load())

		// Both are redelivered (naked, or after AckWait if the server
		// missed the nak): the one with no id and the one pulled with it.
		got := make(chan string, 2)
		h2 := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		errc2, _ := runAsync(t, &natsinbox.Consumer{NoID: natsinbox.NoIDStop}, s.cons(t, js), h2)
		require.ErrorIs(t, testenv.Wait(t, errc2), inbox.ErrNoMessageID)
		assert.Empty(t, got)
	})
}

// Cancelling ctx stops Run after the handler in progress, and the
// messages pulled and not handled go to the next client: naked at once, or
// (on a nak the server did not act on, seen now and then with
// nats-server 2.9.10 under load) after AckWait.
func TestCancelNaksPulled(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, 2*time.Second)
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = testenv.MsgID(i)
	}
	s.publish(t, js, ids...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	h := func(context.Context, *inbox.Message) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return nil
	}
	err := (&natsinbox.Consumer{Batch: 10}).Run(ctx, s.cons(t, js), h)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 3, calls)

	var rest atomic.Int32
	h2 := func(context.Context, *inbox.Message) error { rest.Add(1); return nil }
	errc, cancel2 := runAsync(t, &natsinbox.Consumer{}, s.cons(t, js), h2)
	require.Eventually(t, func() bool { return s.settled(t, js) }, 20*time.Second, 10*time.Millisecond,
		"the other seven come back")
	cancel2()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Equal(t, int32(7), rest.Load())
}

// A handler slower than AckWait keeps its message: the heartbeat restarts
// AckWait while it runs, so a second instance pulling from the same
// consumer never gets it. Without the heartbeat the second instance gets
// the redelivery while the first handler still runs (the check that the
// test can fail).
func TestHeartbeatKeepsSlowMessage(t *testing.T) {
	if testing.Short() {
		t.Skip("a handler that runs for 2.5 s")
	}
	tests := []struct {
		name      string
		heartbeat time.Duration
		wantCalls int32
	}{
		{"heartbeat", 0, 1}, // zero: a third of AckWait
		{"no heartbeat", -1, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, js := connect(t)
			s := newStream(t, js, time.Second)
			s.publish(t, js, "slow-1")
			var calls atomic.Int32
			h := func(ctx context.Context, m *inbox.Message) error {
				if calls.Add(1) == 1 {
					// Slower than AckWait: the duration under test, not
					// a wait for another goroutine.
					time.Sleep(2500 * time.Millisecond)
				}
				return nil
			}
			c := &natsinbox.Consumer{Heartbeat: tt.heartbeat, Batch: 1, MaxWait: time.Second}
			errc, cancel := runAsync(t, c, s.cons(t, js), h)
			errc2, cancel2 := runAsync(t, c, s.cons(t, js), h)
			require.Eventually(t, func() bool { return calls.Load() > 0 && s.settled(t, js) }, 20*time.Second, 10*time.Millisecond)
			cancel()
			cancel2()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			require.ErrorIs(t, testenv.Wait(t, errc2), context.Canceled)
			assert.Equal(t, tt.wantCalls, calls.Load())
		})
	}
}

func TestRunRefusesNilHandler(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, time.Minute)
	assert.Error(t, (&natsinbox.Consumer{}).Run(context.Background(), s.cons(t, js), nil))
}

// The same message delivered to two instances at once: the first
// instance's handler outlives AckWait with no heartbeat, so the server
// redelivers the message to the second instance while the first is still
// in its transaction. The second transaction's inbox insert waits for the
// first's row, then finds it committed and runs nothing: two handler
// calls, one effect.
func TestConcurrentRedeliveryOneEffect(t *testing.T) {
	if testing.Short() {
		t.Skip("a handler that runs for 2.5 s")
	}
	_, js := connect(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	s := newStream(t, js, time.Second)
	s.publish(t, js, "order-1")

	var calls, effects atomic.Int32
	h := in.Handle("d2-concurrent", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.ID); err != nil {
			return err
		}
		effects.Add(1)
		if calls.Add(1) == 1 {
			// Slower than AckWait, holding the inbox row uncommitted.
			time.Sleep(2500 * time.Millisecond)
		}
		return nil
	})
	var deliveries atomic.Int32
	var firstDone, overlapped atomic.Bool
	counted := func(ctx context.Context, m *inbox.Message) error {
		if deliveries.Add(1) == 2 && !firstDone.Load() {
			overlapped.Store(true)
		}
		err := h(ctx, m)
		firstDone.Store(true)
		return err
	}
	c := &natsinbox.Consumer{Heartbeat: -1, Batch: 1, MaxWait: time.Second}
	errc, cancel := runAsync(t, c, s.cons(t, js), counted)
	errc2, cancel2 := runAsync(t, c, s.cons(t, js), counted)
	require.Eventually(t, func() bool { return deliveries.Load() >= 2 && s.settled(t, js) }, 20*time.Second, 10*time.Millisecond)
	cancel()
	cancel2()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	require.ErrorIs(t, testenv.Wait(t, errc2), context.Canceled)
	var rows int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM effects`).Scan(&rows))
	assert.True(t, overlapped.Load(), "the second delivery came while the first handler ran")
	assert.Equal(t, 1, rows, "one effect")
	assert.Equal(t, int32(1), effects.Load(), "the second delivery's effect never ran")
}

// Run returns, with an error, when its connection closes or its consumer
// is deleted, instead of pulling forever.
func TestRunStopsOnLostConsumer(t *testing.T) {
	h := func(context.Context, *inbox.Message) error { return nil }
	t.Run("connection closed", func(t *testing.T) {
		nc, js := connect(t)
		s := newStream(t, js, time.Minute)
		cons := s.cons(t, js)
		errc, _ := runAsync(t, &natsinbox.Consumer{MaxWait: time.Second}, cons, h)
		nc.Close()
		err := testenv.Wait(t, errc)
		require.Error(t, err)
		assert.NotErrorIs(t, err, context.Canceled)
	})
	t.Run("consumer deleted", func(t *testing.T) {
		_, js := connect(t)
		s := newStream(t, js, time.Minute)
		errc, _ := runAsync(t, &natsinbox.Consumer{MaxWait: time.Second}, s.cons(t, js), h)
		require.NoError(t, js.DeleteConsumer(context.Background(), s.name, s.consumer))
		err := testenv.Wait(t, errc)
		assert.True(t, errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted), "%v", err)
	})
}
