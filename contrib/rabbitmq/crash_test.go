package rabbitmq_test

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

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
)

// The crash test's child process reads its settings from these variables.
const (
	childEnv      = "D2_RMQ_CHILD" // "inbox" or "naive"
	childSchema   = "D2_RMQ_SCHEMA"
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
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, seed))
			conn := dial(t)
			db, schema := newSchema(t)
			if mode == "inbox" {
				require.NoError(t, (&inbox.SQL{DB: db}).Migrate(context.Background()))
			}
			queue := newQueue(t, conn, nil)
			msgs := make([]amqp.Publishing, total)
			for i := range msgs {
				msgs[i] = amqp.Publishing{MessageId: msgID(i), Body: []byte(msgID(i))}
			}
			publish(t, conn, queue, msgs...)

			crashes := 0
			for {
				_, distinct := effects(t, db)
				if distinct == total {
					break
				}
				require.Less(t, crashes, 200, "no progress")
				// Crash after 1 to 150 effects, before that one's ack.
				runChild(t, mode, schema, queue, 1+rng.IntN(150), db, total)
				crashes++
			}
			// The last consumer: every delivery the crashes left
			// unacknowledged is redelivered before a marker published
			// after them, which stops it.
			drain(t, conn, db, queue, mode)
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
func runChild(t *testing.T, mode, schema, queue string, crashAfter int, db *sql.DB, total int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"="+mode, childSchema+"="+schema, childQueue+"="+queue,
		childCrashAt+"="+strconv.Itoa(crashAfter))
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
	mode := os.Getenv(childEnv)
	crashAfter, err := strconv.Atoi(os.Getenv(childCrashAt))
	if err != nil {
		return fail(err)
	}
	conn, err := amqp.Dial(os.Getenv(amqpEnv))
	if err != nil {
		return fail(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(err)
	}
	db, err := sql.Open("pgx", withSearchPath(os.Getenv(pgEnv), os.Getenv(childSchema)))
	if err != nil {
		return fail(err)
	}
	done := 0
	effect := effectFunc(mode, db)
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
	c := &rabbitmq.Consumer{Queue: os.Getenv(childQueue)}
	return fail(c.Run(context.Background(), ch, h))
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
	effect := effectFunc(mode, db)
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

func fail(err error) int {
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}
