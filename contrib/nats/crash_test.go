package nats_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	natsinbox "github.com/idemkit/idemhttp/contrib/nats"
	"github.com/idemkit/idemhttp/inbox"
)

// The crash test's child process reads its settings from these variables.
const (
	childEnv      = "D2_NATS_CHILD" // "inbox" or "naive"
	childSchema   = "D2_NATS_SCHEMA"
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
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, seed))
			_, js := connect(t)
			db, schema := newSchema(t)
			if mode == "inbox" {
				require.NoError(t, (&inbox.SQL{DB: db}).Migrate(context.Background()))
			}
			s := newStream(t, js, crashAckWait)
			ids := make([]string, total)
			for i := range ids {
				ids[i] = msgID(i)
			}
			s.publish(t, js, ids...)

			crashes := 0
			for {
				_, distinct := effects(t, db)
				if distinct == total {
					break
				}
				require.Less(t, crashes, 200, "no progress")
				runChild(t, mode, schema, s, 1+rng.IntN(150), db, total)
				crashes++
			}
			// The last consumer: it gets every redelivery of what the
			// crashes left unacked, and runs until all is acked.
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			last := s.cons(t, js)
			go func() {
				errc <- (&natsinbox.Consumer{MaxWait: time.Second}).Run(ctx, last, effectFunc(mode, db))
			}()
			assert.Eventually(t, func() bool { return s.settled(t, js) }, 60*time.Second, 20*time.Millisecond)
			cancel()
			require.ErrorIs(t, <-errc, context.Canceled)

			rows, distinct := effects(t, db)
			t.Logf("%s: %d crashes, %d effect rows for %d messages", mode, crashes, rows, total)
			assert.Equal(t, total, distinct, "every message's effect ran")
			if mode == "inbox" {
				assert.Equal(t, total, rows, "no effect ran twice")
			} else {
				assert.Greater(t, rows, total, "the naive consumer ran effects twice")
			}
		})
	}
}

// runChild runs a consumer process that kills itself after crashAfter
// effects, or that this process kills once every message has an effect,
// and waits for it to die.
func runChild(t *testing.T, mode, schema string, s *testStream, crashAfter int, db *sql.DB, total int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"="+mode, childSchema+"="+schema, childStream+"="+s.name,
		childConsumer+"="+s.consumer, childCrashAt+"="+strconv.Itoa(crashAfter))
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "the child dies only by SIGKILL")
			ws := ee.Sys().(syscall.WaitStatus)
			require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "child: %v", err)
			return
		case <-tick.C:
			// The last child: everything is done before its crash point.
			if _, distinct := effects(t, db); distinct == total {
				_ = cmd.Process.Kill()
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatal("child ran for 60 s")
		}
	}
}

// childMain is the consumer process of TestCrashBeforeAck.
func childMain() int {
	crashAfter, err := strconv.Atoi(os.Getenv(childCrashAt))
	if err != nil {
		return fail(err)
	}
	nc, err := nats.Connect(os.Getenv(natsEnv))
	if err != nil {
		return fail(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	cons, err := js.Consumer(context.Background(), os.Getenv(childStream), os.Getenv(childConsumer))
	if err != nil {
		return fail(err)
	}
	db, err := sql.Open("pgx", withSearchPath(os.Getenv(pgEnv), os.Getenv(childSchema)))
	if err != nil {
		return fail(err)
	}
	done := 0
	effect := effectFunc(os.Getenv(childEnv), db)
	h := func(ctx context.Context, m *inbox.Message) error {
		if err := effect(ctx, m); err != nil {
			return err
		}
		done++
		if done == crashAfter {
			// Committed, not acked: the worst moment to die.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	return fail((&natsinbox.Consumer{}).Run(context.Background(), cons, h))
}

// effectFunc is the consumer's effect for mode: one row in effects,
// through the inbox or on its own.
func effectFunc(mode string, db *sql.DB) inbox.Handler {
	insert := func(ctx context.Context, ex interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, id string) error {
		_, err := ex.ExecContext(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, id)
		return err
	}
	if mode == "naive" {
		return func(ctx context.Context, m *inbox.Message) error { return insert(ctx, db, m.ID) }
	}
	in := &inbox.SQL{DB: db}
	return in.Handle(crashConsumer, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		return insert(ctx, tx, m.ID)
	})
}

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}
