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
// and the function that stops it. A zero MaxWait is taken as 1 s: Run's
// return waits for the pull in progress.
func runAsync(t *testing.T, c *natsinbox.Consumer, cons jetstream.Consumer, h inbox.Handler) (<-chan error, context.CancelFunc) {
	t.Helper()
	if c.MaxWait == 0 {
		cc := *c
		cc.MaxWait = time.Second
		c = &cc
	}
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
	errc, cancel := runAsync(t, &natsinbox.Consumer{Retry: inbox.Retry{Delay: 10 * time.Millisecond}}, s.cons(t, js), committed)
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
// on) and reported (hook and log line: never silent), or naked while Run
// stops with an error naming the stream. (Without the report, the hook
// got nothing: this test failed.)
func TestNoID(t *testing.T) {
	t.Run("term", func(t *testing.T) {
		nc, js := connect(t)
		s := newStream(t, js, time.Minute)
		advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + s.name + "." + s.consumer)
		require.NoError(t, err)
		s.publish(t, js, "", "order-1")
		got := make(chan string, 2)
		h := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		dead := make(chan inbox.DeadLetter, 2)
		errc, cancel := runAsync(t, &natsinbox.Consumer{OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}, s.cons(t, js), h)
		assert.Equal(t, "order-1", <-got, "Run goes on past it")
		_, err = advisories.NextMsg(10 * time.Second)
		require.NoError(t, err, "the server announced the termination")
		require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond,
			"terminated: never redelivered")
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
		assert.Empty(t, got)
		require.Len(t, dead, 1)
		d := <-dead
		assert.ErrorIs(t, d.Err, inbox.ErrNoMessageID)
		assert.Equal(t, s.name, d.Message.IDSpace)
	})
	t.Run("stop", func(t *testing.T) {
		_, js := connect(t)
		s := newStream(t, js, 2*time.Second)
		s.publish(t, js, "", "order-1")
		var calls atomic.Int32
		h := func(context.Context, *inbox.Message) error { calls.Add(1); return nil }
		errc, _ := runAsync(t, &natsinbox.Consumer{NoID: natsinbox.NoIDStop}, s.cons(t, js), h)
		err := testenv.Wait(t, errc)
		require.ErrorIs(t, err, inbox.ErrNoMessageID)
		assert.ErrorContains(t, err, s.name, "the error names the stream")
		assert.Zero(t, calls.Load())

		// Neither is lost (naked, or after AckWait if the server missed
		// the nak): the one with no id comes back, and so does the one
		// pulled with it, unhandled.
		got := make(chan string, 2)
		h2 := func(_ context.Context, m *inbox.Message) error { got <- m.ID; return nil }
		errc2, cancel2 := runAsync(t, &natsinbox.Consumer{}, s.cons(t, js), h2)
		require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond)
		cancel2()
		require.ErrorIs(t, testenv.Wait(t, errc2), context.Canceled)
		assert.Equal(t, "order-1", <-got)
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

// Issue 30 §3.10: at shutdown, the messages pulled and not handled go
// back at once, not after AckWait (a minute here): every one of them
// reaches the next client within seconds, and so do the messages
// published while the shutdown was under way, which a pull still open on
// the server could otherwise take and leave to AckWait. (With the pull's
// context cancelled with Run's, the messages the server had sent and the
// client not yet handed over were dropped: this test failed, some
// arriving only after AckWait.)
func TestShutdownNaksPulledAtOnce(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, time.Minute)
	ids := make([]string, 400)
	for i := range ids {
		ids[i] = testenv.MsgID(i)
	}
	s.publish(t, js, ids[:300]...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	h := func(context.Context, *inbox.Message) error {
		if calls.Add(1) == 1 {
			cancel() // as the rest of the batch arrives
		}
		return nil
	}
	// A pull for more than the stream holds stays open on the server.
	err := (&natsinbox.Consumer{Batch: 500, MaxWait: 2 * time.Second}).Run(ctx, s.cons(t, js), h)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, int32(1), calls.Load())
	s.publish(t, js, ids[300:]...) // after the shutdown, while that pull could still be open

	var rest atomic.Int32
	errc, cancel2 := runAsync(t, &natsinbox.Consumer{}, s.cons(t, js), func(context.Context, *inbox.Message) error { rest.Add(1); return nil })
	require.Eventually(t, func() bool { return s.settled(t, js) }, 15*time.Second, 10*time.Millisecond,
		"every other message comes back at once, not after AckWait")
	cancel2()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Equal(t, int32(len(ids)-1), rest.Load())
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
			if tt.heartbeat >= 0 {
				assert.Equal(t, tt.wantCalls, calls.Load())
				return
			}
			// Without the heartbeat, at least one redelivery while the
			// first handler still runs; a busy machine may see AckWait
			// end once more before the second run's ack lands (a CI
			// run: 3).
			assert.GreaterOrEqual(t, calls.Load(), tt.wantCalls)
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

// Run refuses a consumer whose ack policy cannot redeliver a failed
// message, before it pulls anything: AckNone (an ordered consumer too)
// and AckAll. (Without the check, Run pulled and the AckNone consumer's
// message was gone after one failed attempt: this test failed, Run
// running until the test's deadline.)
func TestAckPolicyRefused(t *testing.T) {
	tests := []struct {
		name string
		give func(t *testing.T, js jetstream.JetStream) (jetstream.Consumer, *testStream)
	}{
		{name: "AckNone", give: func(t *testing.T, js jetstream.JetStream) (jetstream.Consumer, *testStream) {
			s := newStreamWith(t, js, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
			return s.cons(t, js), s
		}},
		{name: "AckAll", give: func(t *testing.T, js jetstream.JetStream) (jetstream.Consumer, *testStream) {
			s := newStreamWith(t, js, jetstream.ConsumerConfig{AckPolicy: jetstream.AckAllPolicy})
			return s.cons(t, js), s
		}},
		{name: "ordered", give: func(t *testing.T, js jetstream.JetStream) (jetstream.Consumer, *testStream) {
			s := newStream(t, js, time.Minute)
			c, err := js.OrderedConsumer(context.Background(), s.name, jetstream.OrderedConsumerConfig{})
			require.NoError(t, err)
			return c, s
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, js := connect(t)
			cons, s := tt.give(t, js)
			s.publish(t, js, "order-1")
			var calls atomic.Int32
			h := func(context.Context, *inbox.Message) error { calls.Add(1); return errors.New("fails") }
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := (&natsinbox.Consumer{}).Run(ctx, cons, h)
			require.ErrorIs(t, err, natsinbox.ErrAckPolicy)
			assert.Zero(t, calls.Load(), "nothing pulled")
		})
	}
}

// Cancelling Run while a handler runs naks its message for redelivery
// at once, whatever the settings: with MaxDeliveries 1, a failure
// terminates a message, but a shutdown never does. A handler that still
// returns nil has committed: its message is acked. (With Run treating
// the shutdown's error as a handler failure, the message was terminated
// and never came back: this test failed.)
func TestShutdownNaks(t *testing.T) {
	tests := []struct {
		name      string
		returnNil bool
		wantBack  bool
	}{
		{name: "handler fails", wantBack: true},
		{name: "handler committed", returnNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, js := connect(t)
			// AckWait 3 s: the message comes back after it even when the
			// server misses the nak (seen with 2.9.10 under load).
			s := newStream(t, js, 3*time.Second)
			s.publish(t, js, "order-1")
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
			c := &natsinbox.Consumer{Retry: inbox.Retry{Delay: time.Hour, MaxDeliveries: 1}, OnDeadLetter: func(inbox.DeadLetter) { dead.Add(1) }}
			errc, cancel := runAsync(t, c, s.cons(t, js), h)
			<-started
			cancel()
			require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			assert.Zero(t, dead.Load(), "never terminated")
			if !tt.wantBack {
				require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond, "acked")
				return
			}
			back := make(chan string, 1)
			errc2, cancel2 := runAsync(t, &natsinbox.Consumer{}, s.cons(t, js), func(_ context.Context, m *inbox.Message) error {
				back <- m.ID
				return nil
			})
			select {
			case id := <-back:
				assert.Equal(t, "order-1", id)
			case <-time.After(15 * time.Second):
				t.Error("the message never came back")
			}
			cancel2()
			require.ErrorIs(t, testenv.Wait(t, errc2), context.Canceled)
		})
	}
}

// A handler that always fails: its message is delivered MaxDeliveries
// times, each redelivery later than the one before by at least the
// Retry's growing delay (a nak with that delay), then terminated (the
// server publishes MSG_TERMINATED) and reported once. A healthy message
// behind it is handled meanwhile. (With the nak's delay taken out, the
// gaps were a few milliseconds; with no limit, no advisory came: this
// test failed both ways.)
func TestPoisonTerminated(t *testing.T) {
	nc, js := connect(t)
	s := newStream(t, js, time.Minute)
	advisories, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + s.name + "." + s.consumer)
	require.NoError(t, err)
	s.publish(t, js, "poison", "ok-1")
	retry := inbox.Retry{Delay: 200 * time.Millisecond, MaxDelay: time.Second, MaxDeliveries: 3}
	poison := &testenv.PoisonHandler{Poison: "poison"}
	h := poison.Handle
	dead := make(chan inbox.DeadLetter, 2)
	errc, cancel := runAsync(t, &natsinbox.Consumer{Retry: retry, MaxWait: time.Second, OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}, s.cons(t, js), h)
	var d inbox.DeadLetter
	select {
	case d = <-dead:
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("never given up")
	}
	_, err = advisories.NextMsg(10 * time.Second)
	require.NoError(t, err, "the server announced the termination")
	require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)

	poison.AssertRedeliveries(t, retry, 3)
	assert.Equal(t, []string{"poison", "ok-1"}, poison.Order()[:2], "the healthy message did not wait behind the poison")
	assert.Equal(t, 3, d.Deliveries)
	assert.ErrorContains(t, d.Err, "cannot parse")
	assert.Contains(t, d.To, "MSG_TERMINATED")
	assert.Empty(t, dead, "reported once")
}

// Run refuses a consumer with a MaxDeliver limit before it pulls
// anything: the server counts the naks of shutdowns and of messages
// pulled ahead toward it, and past it stops delivering a healthy message.
// (Without the check, the second shutdown's nak left the message
// undelivered for good: this test failed.)
func TestMaxDeliverRefused(t *testing.T) {
	_, js := connect(t)
	s := newStreamWith(t, js, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxDeliver: 2})
	s.publish(t, js, "order-1")
	var calls atomic.Int32
	err := (&natsinbox.Consumer{MaxWait: time.Second}).Run(context.Background(), s.cons(t, js), func(context.Context, *inbox.Message) error {
		calls.Add(1)
		return nil
	})
	require.ErrorIs(t, err, natsinbox.ErrMaxDeliver)
	assert.ErrorContains(t, err, s.consumer)
	assert.Zero(t, calls.Load(), "nothing pulled")
}

// Issue 30 §3.9. Deliveries that never ran (pulled and never settled, as
// a client that died holding them leaves them, or a prefetch) and
// shutdowns while the handler ran all raise the server's NumDelivered,
// and none counts toward the dead-letter limit: the message then runs,
// once, and is acked. (With Run deciding from NumDelivered, as it did,
// the message was terminated on arrival without running: this test
// failed.)
func TestHandedBackNeverCounts(t *testing.T) {
	_, js := connect(t)
	s := newStream(t, js, time.Second)
	s.publish(t, js, "healthy")
	cons := s.cons(t, js)
	for range 3 { // pulled, never settled: back after AckWait
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		n := 0
		for range batch.Messages() {
			n++
		}
		require.Equal(t, 1, n)
	}
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
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
		errc, cancel := runAsync(t, &natsinbox.Consumer{Ledger: in.Ledger("d2-handback"), Retry: retry, OnDeadLetter: onDead}, cons, h)
		select {
		case <-started:
		case err := <-errc:
			t.Fatalf("Run: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("no delivery: terminated?")
		}
		cancel()
		require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	}
	done := make(chan string, 1)
	errc, cancel := runAsync(t, &natsinbox.Consumer{Ledger: in.Ledger("d2-handback"), Retry: retry, OnDeadLetter: onDead}, cons,
		func(_ context.Context, m *inbox.Message) error { done <- m.ID; return nil })
	select {
	case id := <-done:
		assert.Equal(t, "healthy", id)
	case <-time.After(15 * time.Second):
		t.Fatal("the message never ran")
	}
	require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond, "acked")
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Zero(t, dead.Load(), "never terminated")
}

// Each message's IDSpace is its stream, so that two streams carrying
// different messages under the same Nats-Msg-Id both run through one
// inbox; declaring one IDSpace shares it. (With the adapter leaving
// IDSpace empty, the second stream's order-1 was a duplicate: the first
// case failed.)
func TestIDSpace(t *testing.T) {
	tests := []struct {
		name    string
		idSpace string
		want    int
	}{
		{name: "per stream", want: 2},
		{name: "declared shared", idSpace: "orders", want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, js := connect(t)
			db, _ := testenv.EffectsDB(t, "d2_")
			in := &inbox.SQL{DB: db}
			require.NoError(t, in.Migrate(context.Background()))
			h := in.Handle("d2-spaces", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
				return testenv.InsertEffect(ctx, tx, m.IDSpace+"/"+m.ID)
			})
			for range 2 {
				s := newStream(t, js, time.Minute)
				s.publish(t, js, "order-1")
				errc, cancel := runAsync(t, &natsinbox.Consumer{IDSpace: tt.idSpace, MaxWait: time.Second}, s.cons(t, js), h)
				require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond)
				cancel()
				require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
			}
			rows, _ := testenv.Effects(t, db)
			assert.Equal(t, tt.want, rows)
		})
	}
}

// A handler that hangs, ignoring its context, holds its message only
// until the processing limit: then the heartbeats stop and the message is
// naked, another instance gets it long before AckWait and commits its
// effect, and the hung handler's late return acks nothing. (Without the
// nak at the limit, the message waited for AckWait: this test failed.)
func TestProcessingLimit(t *testing.T) {
	_, js := connect(t)
	db, _ := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	// AckWait 30 s, longer than the test waits: only the nak at the limit
	// brings the message back in time.
	s := newStream(t, js, 30*time.Second)
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
	errA, cancelA := runAsync(t, &natsinbox.Consumer{ProcessingLimit: 300 * time.Millisecond, Batch: 1, MaxWait: time.Second}, s.cons(t, js), stuck)
	s.publish(t, js, "order-1")
	<-hung
	done := make(chan string, 1)
	errB, cancelB := runAsync(t, &natsinbox.Consumer{MaxWait: time.Second}, s.cons(t, js), func(ctx context.Context, m *inbox.Message) error {
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
		t.Errorf("Run: %v", err)
	case <-time.After(15 * time.Second):
		t.Error("the hung handler's message never reached the other instance")
	}
	close(unblock)
	require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond)
	cancelB()
	require.ErrorIs(t, testenv.Wait(t, errB), context.Canceled)
	cancelA()
	require.ErrorIs(t, testenv.Wait(t, errA), context.Canceled)
	rows, _ := testenv.Effects(t, db)
	assert.Equal(t, 1, rows)
}
