package nats_test

import (
	"context"
	"database/sql"
	"os"
	"strconv"
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

// The crash test's child process reads its settings from these variables.
const (
	childEnv      = "D2_NATS_CHILD" // "inbox" or "naive"
	childDSN      = "D2_NATS_DSN"
	childStream   = "D2_NATS_STREAM"
	childConsumer = "D2_NATS_CONSUMER"
	childCrashAt  = "D2_NATS_CRASH_AFTER"
	crashConsumer = "d2-crash"
	// crashAckWait is the consumer's AckWait: how long after a crash the
	// server redelivers what the dead process had not acked.
	crashAckWait = time.Second
)

// TestCrashBeforeAck kills a consumer process with SIGKILL after a
// message's effect committed and before its ack, again and again at
// random points, over 1,000 messages, restarting it each time; then a
// last consumer runs until the server has every message acked. With the
// inbox every message's effect is in the table exactly once. A naive
// consumer (the same loop and crashes, the effect committed on its own
// and no inbox) shows the duplicates each crash makes: that half is the
// check that the test can fail, and fails when the inbox is taken out.
func TestCrashBeforeAck(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test: a few seconds")
	}
	const total = 1000
	for _, mode := range []string{"inbox", "naive"} {
		t.Run(mode, func(t *testing.T) {
			_, js := connect(t)
			db, schema := testenv.EffectsDB(t, "d2_")
			if mode == "inbox" {
				require.NoError(t, (&inbox.SQL{DB: db}).Migrate(context.Background()))
			}
			s := newStream(t, js, crashAckWait)
			ids := make([]string, total)
			for i := range ids {
				ids[i] = testenv.MsgID(i)
			}
			s.publish(t, js, ids...)
			// Crash after 1 to 150 effects, before that one's ack.
			crashes := testenv.CrashUntilDone(t, db, total, 150, func(crashAfter int) {
				runChild(t, mode, schema, s, crashAfter, db, total)
			})
			// The last consumer: it gets every redelivery of what the
			// crashes left unacked, and runs until all is acked.
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			last := s.cons(t, js)
			go func() {
				errc <- (&natsinbox.Consumer{MaxWait: time.Second}).Run(ctx, last, testenv.EffectHandler(mode, db, crashConsumer))
			}()
			assert.Eventually(t, func() bool { return s.settled(t, js) }, 60*time.Second, 20*time.Millisecond)
			cancel()
			require.ErrorIs(t, <-errc, context.Canceled)

			testenv.AssertEffects(t, mode, db, total, crashes)
		})
	}
}

// runChild runs a consumer process that kills itself after crashAfter
// effects, or that this process kills once every message has an effect,
// and waits for it to die.
func runChild(t *testing.T, mode string, schema *testenv.Schema, s *testStream, crashAfter int, db *sql.DB, total int) {
	t.Helper()
	killed := testenv.RunChild(t, []string{
		childEnv + "=" + mode, childDSN + "=" + schema.URL, childStream + "=" + s.name,
		childConsumer + "=" + s.consumer, childCrashAt + "=" + strconv.Itoa(crashAfter),
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
	nc, err := nats.Connect(os.Getenv(testenv.NATSEnv))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return testenv.ChildFailed(err)
	}
	cons, err := js.Consumer(context.Background(), os.Getenv(childStream), os.Getenv(childConsumer))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	db, err := sql.Open("pgx", os.Getenv(childDSN))
	if err != nil {
		return testenv.ChildFailed(err)
	}
	if os.Getenv(childEnv) == "killer" {
		// A consumer that dies in the handler of the message "killer",
		// with the inbox's ledger.
		c := &natsinbox.Consumer{Ledger: (&inbox.SQL{DB: db}).Ledger(crashConsumer), Retry: killerRetry, MaxWait: time.Second}
		return testenv.ChildFailed(c.Run(context.Background(), cons, func(_ context.Context, m *inbox.Message) error {
			if m.ID == "killer" {
				testenv.Die()
			}
			return nil
		}))
	}
	h := testenv.DieAfter(crashAfter, testenv.EffectHandler(os.Getenv(childEnv), db, crashConsumer))
	return testenv.ChildFailed((&natsinbox.Consumer{}).Run(context.Background(), cons, h))
}

// killerRetry is the Retry of TestKillerMessageTerminated's consumers.
var killerRetry = inbox.Retry{MaxDeliveries: 2}

// Issue 30 §3.9: a crash while the handler runs counts. A message that
// kills every client that runs it (three children SIGKILLed in its
// handler) is terminated on arrival by the next, from the inbox's ledger,
// without running again: its first delivery is not counted (no run is
// marked before the server says it may be a redelivery), the next two
// are. (With no ledger, the handler ran a fourth time: this test failed.)
func TestKillerMessageTerminated(t *testing.T) {
	_, js := connect(t)
	db, schema := testenv.EffectsDB(t, "d2_")
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	s := newStream(t, js, crashAckWait)
	s.publish(t, js, "killer")
	for range 3 {
		killed := testenv.RunChild(t, []string{childEnv + "=killer", childDSN + "=" + schema.URL, childStream + "=" + s.name,
			childConsumer + "=" + s.consumer, childCrashAt + "=0"}, nil)
		require.True(t, killed, "the child died in the handler")
	}
	var calls atomic.Int32
	dead := make(chan inbox.DeadLetter, 1)
	c := &natsinbox.Consumer{Ledger: in.Ledger(crashConsumer), Retry: killerRetry, OnDeadLetter: func(d inbox.DeadLetter) { dead <- d }}
	errc, cancel := runAsync(t, c, s.cons(t, js), func(context.Context, *inbox.Message) error { calls.Add(1); return nil })
	select {
	case d := <-dead:
		assert.ErrorIs(t, d.Err, inbox.ErrExhausted)
		assert.Equal(t, 2, d.Deliveries, "two counted crashes")
	case <-time.After(30 * time.Second):
		t.Fatal("not terminated")
	}
	require.Eventually(t, func() bool { return s.settled(t, js) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	require.ErrorIs(t, testenv.Wait(t, errc), context.Canceled)
	assert.Zero(t, calls.Load(), "never ran again")
}
