package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/testenv"
)

// The child process's settings.
const (
	envChild     = "D1_KAFKA_CHILD"      // the mode: "inbox" or "offsets"
	envSeeds     = "D1_KAFKA_SEEDS"      // the cluster
	envDriver    = "D1_KAFKA_DRIVER"     // the effects' database
	envDSN       = "D1_KAFKA_DSN"        //
	envKillAfter = "D1_KAFKA_KILL_AFTER" // SIGKILL itself after this many effects; 0: never
	envWant      = "D1_KAFKA_WANT"       // exit 0 once this many distinct ids have effects in both tables
	envKillInTx  = "D1_KAFKA_KILL_IN_TX" // "1": die inside the transaction instead, before its commit
)

const crashTopic = "orders"

// TestCrashExactlyOnce runs a consumer process that SIGKILLs itself at
// random points over 1,000 messages, six times right after a message's
// transaction committed and before its offset was committed to Kafka (the
// worst moment: the effect is done and Kafka does not know), twice inside
// the transaction before its commit (which loses the message if the
// adapter committed the offset before the handler ran: with Run patched
// to commit each poll's offsets before handling it, this test failed, the
// child waiting for messages that never came back), and restarts it until
// every message is processed. Beside the inbox's consumer, in the
// same process but its own group, a naive consumer (the effect alone,
// offsets committed after it as usual) runs on the same records and dies
// at the same moments. Afterwards every message's effect happened exactly
// once through the inbox, and the naive consumer shows its duplicates.
//
// In "inbox" mode the producer also wrote 20 messages twice (a retry after
// a lost acknowledgement: same message-id header, new offset), which the
// inbox dedups and the naive consumer does not. In "offsets" mode there
// are no such duplicates (the mode does not dedup them, see SQLOffsets).
//
// The naive consumer is this test with the guarantee removed, run in the
// same processes: the exactly-once checks applied to its table fail in
// every run (hundreds of duplicates), which is what the last assertion
// shows.
func TestCrashExactlyOnce(t *testing.T) {
	for _, mode := range []string{"inbox", "offsets"} {
		t.Run(mode, func(t *testing.T) { testCrash(t, mode) })
	}
}

func testCrash(t *testing.T, mode string) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	const messages = 1000
	seeds := newCluster(t, crashTopic, 4)
	st := newStore(t)
	db := st.mustOpen(t)
	setupCrashTables(t, db, mode)

	var rs []record
	for i := range messages {
		rs = append(rs, record{key: strconv.Itoa(i), id: fmt.Sprintf("order-%04d", i), body: "x", partition: int32(i % 4)})
	}
	producerDups := 0
	if mode == "inbox" {
		for i := 0; i < messages; i += messages / 20 {
			rs = append(rs, rs[i]) // the producer's retry: the same id at a later offset
			producerDups++
		}
	}
	produce(t, seeds, crashTopic, rs)

	kills := 0
	for run := 0; ; run++ {
		require.Less(t, run, 40, "the consumer never finished")
		killAfter, inTx := 0, "0"
		if kills < 8 {
			// At most 119 effects a run, so that seven runs leave more
			// than that many messages for the eighth, which then always
			// dies too (with up to 169, a run that planned to die could
			// run out of messages first: 7 kills, the test failing about
			// one time in 25).
			killAfter = 20 + rand.IntN(100)
		}
		if kills%4 == 3 {
			inTx = "1"
		}
		killed := testenv.RunChild(t, []string{
			envChild + "=" + mode, envSeeds + "=" + seeds, envDriver + "=" + st.driver, envDSN + "=" + st.dsn,
			envKillAfter + "=" + strconv.Itoa(killAfter), envWant + "=" + strconv.Itoa(messages), envKillInTx + "=" + inTx,
		}, nil)
		if killed {
			kills++
			continue
		}
		break
	}
	require.Equal(t, 8, kills)

	// Every message's effect exactly once, through the inbox.
	var distinct, total, maxPer int
	require.NoError(t, db.QueryRow("SELECT count(DISTINCT id), count(*) FROM d1_effects").Scan(&distinct, &total))
	require.NoError(t, db.QueryRow("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM d1_effects GROUP BY id) AS c").Scan(&maxPer))
	assert.Equal(t, messages, distinct, "every message processed")
	assert.Equal(t, messages, total, "no message processed twice")
	assert.Equal(t, 1, maxPer)

	var naiveDistinct, naiveTotal int
	require.NoError(t, db.QueryRow("SELECT count(DISTINCT id), count(*) FROM d1_naive").Scan(&naiveDistinct, &naiveTotal))
	assert.Equal(t, messages, naiveDistinct)
	assert.Greater(t, naiveTotal, messages+producerDups, "the naive consumer repeats effects after each kill")
	t.Logf("%s mode, %d kills: inbox %d effects for %d messages; naive consumer %d effects (%d duplicates, %d of them the producer's)",
		mode, kills, total, messages, naiveTotal, naiveTotal-messages, producerDups)
}

func setupCrashTables(t *testing.T, db *sql.DB, mode string) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		"CREATE TABLE d1_effects (id text NOT NULL)",
		"CREATE TABLE d1_naive (id text NOT NULL)",
	} {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	if mode == "inbox" {
		require.NoError(t, (&inbox.SQL{DB: db, Table: "d1_inbox"}).Migrate(ctx))
	} else {
		require.NoError(t, (&kafka.SQLOffsets{DB: db, Table: "d1_offsets"}).Migrate(ctx))
	}
}

// killerRetry is the Retry of TestKillerRecordDeadLettered's consumers.
var killerRetry = inbox.Retry{MaxDeliveries: 2}

// Issue 30 §3.9: a crash while the handler runs counts. A record that
// kills every member that runs it (two children SIGKILLed in its handler)
// is dead-lettered on arrival by the next, from the inbox's ledger,
// without running again: a record read first after an assignment may be
// one a dead member was handling, so its run is marked before it starts.
// (With no ledger, the handler ran a third time: this test failed.)
func TestKillerRecordDeadLettered(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	seeds := newCluster(t, crashTopic, 1)
	st := newStore(t)
	db := st.mustOpen(t)
	in := &inbox.SQL{DB: db}
	require.NoError(t, in.Migrate(context.Background()))
	produce(t, seeds, crashTopic, []record{{id: "killer"}, {id: "after"}})
	for range 2 {
		killed := testenv.RunChild(t, []string{envChild + "=killer", envSeeds + "=" + seeds, envDriver + "=" + st.driver, envDSN + "=" + st.dsn}, nil)
		require.True(t, killed, "the child died in the handler")
	}
	var ran []string
	var mu sync.Mutex
	dead := make(chan inbox.DeadLetter, 1)
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "killer", Topics: []string{crashTopic}, Ledger: in.Ledger("killer"), Retry: killerRetry,
		Handler: func(_ context.Context, m *inbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, m.ID)
			return nil
		},
		DeadLetter:   func(context.Context, *inbox.Message) error { return nil },
		OnDeadLetter: func(d inbox.DeadLetter) { dead <- d },
	}, groupOpts(seeds)...)
	require.NoError(t, err)
	stop := run(t, c)
	select {
	case d := <-dead:
		assert.Equal(t, "killer", d.Message.ID)
		assert.ErrorIs(t, d.Err, inbox.ErrExhausted)
		assert.Equal(t, 2, d.Deliveries, "two counted crashes")
	case <-time.After(30 * time.Second):
		t.Fatal("not dead-lettered")
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 1 }, 30*time.Second, 10*time.Millisecond)
	stop()
	assert.Equal(t, []string{"after"}, ran, "the killer never ran again; the record after it did")
}

// killerChild is the consumer process of TestKillerRecordDeadLettered: it
// dies in the handler of the record "killer".
func killerChild() int {
	st := store{driver: os.Getenv(envDriver), dsn: os.Getenv(envDSN)}
	db, err := st.open()
	if err != nil {
		return testenv.ChildFailed(err)
	}
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "killer", Topics: []string{crashTopic}, Ledger: (&inbox.SQL{DB: db}).Ledger("killer"), Retry: killerRetry,
		Handler: func(_ context.Context, m *inbox.Message) error {
			if m.ID == "killer" {
				testenv.Die()
			}
			return nil
		},
		DeadLetter: func(context.Context, *inbox.Message) error { return nil },
	}, groupOpts(os.Getenv(envSeeds))...)
	if err != nil {
		return testenv.ChildFailed(err)
	}
	return testenv.ChildFailed(c.Run(context.Background()))
}

// child is the consumer process of TestCrashExactlyOnce.
func child() int {
	mode := os.Getenv(envChild)
	if mode == "killer" {
		return killerChild()
	}
	killAfter, _ := strconv.Atoi(os.Getenv(envKillAfter))
	want, _ := strconv.Atoi(os.Getenv(envWant))
	st := store{driver: os.Getenv(envDriver), dsn: os.Getenv(envDSN)}
	db, err := st.open()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	seeds := os.Getenv(envSeeds)

	inTx := os.Getenv(envKillInTx) == "1"
	var effects atomic.Int64
	afterCommit := func() {
		// The transaction committed; Run commits the offset only after
		// the whole poll: die in between.
		if !inTx && killAfter > 0 && effects.Add(1) == int64(killAfter) {
			testenv.Die()
		}
	}
	write := func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO d1_effects (id) VALUES ($1)", m.Header["message-id"][0])
		// Dying here, with the effect written but not committed, loses
		// the message if the offset was committed before the handler ran.
		if err == nil && inTx && killAfter > 0 && effects.Add(1) == int64(killAfter) {
			testenv.Die()
		}
		return err
	}
	var h inbox.Handler
	cfg := kafka.Config{Group: "ledger", Topics: []string{crashTopic}, OnError: func(err error) { fmt.Fprintln(os.Stderr, err) }}
	if mode == "inbox" {
		h = (&inbox.SQL{DB: db, Table: "d1_inbox"}).Handle("ledger", write)
	} else {
		offs := &kafka.SQLOffsets{DB: db, Table: "d1_offsets"}
		h = offs.Handle("ledger", write)
		cfg.Positions = offs
	}
	cfg.Handler = func(ctx context.Context, m *inbox.Message) error {
		if err := h(ctx, m); err != nil {
			return err
		}
		afterCommit()
		return nil
	}
	c, err := kafka.NewConsumer(cfg, groupOpts(seeds)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	naive, err := kafka.NewConsumer(kafka.Config{
		Group: "naive", Topics: []string{crashTopic},
		Handler: func(ctx context.Context, m *inbox.Message) error {
			_, err := db.ExecContext(ctx, "INSERT INTO d1_naive (id) VALUES ($1)", m.Header["message-id"][0])
			return err
		},
	}, groupOpts(seeds)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer naive.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 2)
	go func() { done <- c.Run(runCtx) }()
	go func() { done <- naive.Run(runCtx) }()

	// Both consumers are done when each table has every id; then stop.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "child: timed out")
			return 3
		case err := <-done:
			fmt.Fprintln(os.Stderr, "child: consumer stopped:", err)
			return 3
		case <-tick.C:
		}
		var a, b int
		if err := db.QueryRow("SELECT (SELECT count(DISTINCT id) FROM d1_effects), (SELECT count(DISTINCT id) FROM d1_naive)").Scan(&a, &b); err != nil {
			fmt.Fprintln(os.Stderr, err)
			continue
		}
		if a == want && b == want {
			stop()
			<-done
			<-done
			return 0
		}
	}
}
