// Command consumer shows a queue consumer that is killed mid-stream and
// restarted without applying any message twice, beside a naive consumer
// that does.
//
// It starts an in-process Kafka cluster (franz-go's kfake, on a loopback
// port) and produces 300 orders, each with a producer-assigned message-id
// header; 10 of them are produced twice, as a producer that retries after
// a lost acknowledgement does. Then it runs itself again as a child
// process: the consumers. The child runs two consumer groups on the same
// topic, both writing a ledger row per order into one embedded SQLite
// database (modernc.org/sqlite, pure Go):
//
//   - the inbox consumer records each message id in the ledger row's own
//     transaction (inbox.SQL), and commits offsets after it (contrib/kafka);
//   - the naive consumer writes the row, and commits offsets after it too.
//
// Twice, the child SIGKILLs itself right after a ledger transaction
// committed and before the offset commit, the moment at which a consumer
// has done the work and Kafka does not know; the naive consumer is then
// in the middle of a poll too, a row written and its offset not
// committed. The parent restarts it each time, and at the end counts the
// ledger rows per order.
//
//	go run ./examples/consumer
//
// It runs offline in a few seconds, in a temporary directory it removes.
package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
)

const (
	orders       = 300 // distinct orders produced
	producerDups = 10  // orders the producer writes twice
	kills        = 2   // times the consumer process is SIGKILLed
	topic        = "orders"

	// The child learns its role and settings from these.
	envSeeds     = "CONSUMER_EXAMPLE_SEEDS"
	envDB        = "CONSUMER_EXAMPLE_DB"
	envKillAfter = "CONSUMER_EXAMPLE_KILL_AFTER"
)

func main() {
	if seeds := os.Getenv(envSeeds); seeds != "" {
		os.Exit(child(seeds, os.Getenv(envDB), os.Getenv(envKillAfter)))
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := run(ctx, self, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if !rep.ok() {
		os.Exit(1)
	}
}

// report is what run measured.
type report struct {
	Kills          int // times the consumer was SIGKILLed
	InboxRows      int // ledger rows the inbox consumer wrote
	InboxOrders    int // distinct orders among them
	NaiveRows      int // ledger rows the naive consumer wrote
	NaiveOrders    int // distinct orders among them
	ProducerWrites int // records produced, retries included
}

func (r report) ok() bool { return r.InboxRows == orders && r.InboxOrders == orders }

// run produces the orders, runs the consumer process (self) until it has
// processed them all, killing it twice, and prints the counts to out.
func run(ctx context.Context, self string, out io.Writer) (report, error) {
	var rep report
	dir, err := os.MkdirTemp("", "idemhttp-consumer-example-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	dbPath := filepath.Join(dir, "ledger.db")
	db, err := sqlite.Open(dbPath)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	if err := setup(ctx, db); err != nil {
		return rep, err
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return rep, err
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()[0]
	if rep.ProducerWrites, err = produce(ctx, seeds); err != nil {
		return rep, err
	}
	fmt.Fprintf(out, "produced %d orders to an in-process Kafka (%d records: the producer retried %d)\n",
		orders, rep.ProducerWrites, producerDups)

	for attempt := 0; ; attempt++ {
		if attempt > 10 {
			return rep, errors.New("the consumer never finished")
		}
		killAfter := 0
		if rep.Kills < kills {
			killAfter = 40 + rand.IntN(80)
		}
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), envSeeds+"="+seeds, envDB+"="+dbPath, envKillAfter+"="+strconv.Itoa(killAfter))
		cmd.Stderr = os.Stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) && exitErr.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
			rep.Kills++
			fmt.Fprintf(out, "consumer SIGKILLed after a commit, before its offset commit (%d/%d); restarting\n", rep.Kills, kills)
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("consumer: %w", err)
		}
		break
	}

	q := "SELECT count(*), count(DISTINCT order_id) FROM "
	if err := db.QueryRowContext(ctx, q+"ledger").Scan(&rep.InboxRows, &rep.InboxOrders); err != nil {
		return rep, err
	}
	if err := db.QueryRowContext(ctx, q+"naive_ledger").Scan(&rep.NaiveRows, &rep.NaiveOrders); err != nil {
		return rep, err
	}
	fmt.Fprintf(out, "inbox consumer: %d ledger rows for %d orders: %d duplicates\n", rep.InboxRows, rep.InboxOrders, rep.InboxRows-rep.InboxOrders)
	fmt.Fprintf(out, "naive consumer: %d ledger rows for %d orders: %d duplicates\n", rep.NaiveRows, rep.NaiveOrders, rep.NaiveRows-rep.NaiveOrders)
	return rep, nil
}

func setup(ctx context.Context, db *sql.DB) error {
	for _, q := range []string{
		"CREATE TABLE ledger (order_id text NOT NULL, amount integer NOT NULL)",
		"CREATE TABLE naive_ledger (order_id text NOT NULL, amount integer NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return (&inbox.SQL{DB: db}).Migrate(ctx)
}

// produce writes the orders, and the producer's retries, and returns the
// number of records written.
func produce(ctx context.Context, seeds string) (int, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic(topic))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var recs []*kgo.Record
	for i := range orders {
		id := fmt.Sprintf("order-%03d", i)
		r := &kgo.Record{
			Key:     []byte(id),
			Value:   []byte(`{"amount":` + strconv.Itoa(100+i) + `}`),
			Headers: []kgo.RecordHeader{{Key: kafka.DefaultIDHeader, Value: []byte(id)}},
		}
		recs = append(recs, r)
		if i%(orders/producerDups) == 0 {
			dup := *r
			recs = append(recs, &dup) // the same message, written again
		}
	}
	return len(recs), cl.ProduceSync(ctx, recs...).FirstErr()
}

// child is the consumer process: both consumers, until both ledgers hold
// every order, or until it kills itself after killAfter inbox commits.
func child(seeds, dbPath, killAfterEnv string) int {
	killAfter, _ := strconv.Atoi(killAfterEnv)
	db, err := sqlite.Open(dbPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	groupOpts := []kgo.Opt{
		kgo.SeedBrokers(seeds),
		kgo.SessionTimeout(600 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}

	// In a run that ends in a kill, the naive consumer stops in the middle
	// of a poll, after writing a row and before its offsets are committed,
	// and the kill waits for it: both consumers then die with work done
	// that Kafka does not know of. (Left to run at its own pace, the naive
	// consumer was sometimes between polls, everything committed, when the
	// kill came, and showed no duplicate.)
	naiveStalled := make(chan struct{})
	var naiveRows atomic.Int64

	in := &inbox.SQL{DB: db}
	var committed atomic.Int64
	ledger := in.Handle("ledger", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO ledger (order_id, amount) VALUES ($1, 1)", m.ID)
		return err
	})
	good, err := kafka.NewConsumer(kafka.Config{
		Group: "ledger", Topics: []string{topic},
		Handler: func(ctx context.Context, m *inbox.Message) error {
			if err := ledger(ctx, m); err != nil {
				return err
			}
			// Committed; the offset is committed after the poll's
			// records: the worst moment to die.
			if killAfter > 0 && committed.Add(1) == int64(killAfter) {
				select {
				case <-naiveStalled:
				case <-time.After(10 * time.Second):
				}
				// os.Process.Kill is SIGKILL on Unix (and builds on Windows).
				if p, err := os.FindProcess(os.Getpid()); err == nil {
					_ = p.Kill()
				}
			}
			return nil
		},
	}, groupOpts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer good.Close()
	naive, err := kafka.NewConsumer(kafka.Config{
		Group: "naive-ledger", Topics: []string{topic},
		Handler: func(ctx context.Context, m *inbox.Message) error {
			_, err := db.ExecContext(ctx, "INSERT INTO naive_ledger (order_id, amount) VALUES ($1, 1)", m.ID)
			if err == nil && killAfter > 0 && naiveRows.Add(1) == int64(killAfter)/2 {
				close(naiveStalled)
				<-ctx.Done() // the kill comes first
				return ctx.Err()
			}
			return err
		},
	}, groupOpts...)
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
	go func() { done <- good.Run(runCtx) }()
	go func() { done <- naive.Run(runCtx) }()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "consumer: timed out")
			return 3
		case err := <-done:
			fmt.Fprintln(os.Stderr, "consumer stopped:", err)
			return 3
		case <-tick.C:
		}
		var a, b int
		err := db.QueryRowContext(ctx, "SELECT (SELECT count(DISTINCT order_id) FROM ledger), (SELECT count(DISTINCT order_id) FROM naive_ledger)").Scan(&a, &b)
		if err == nil && a == orders && b == orders {
			stop()
			<-done
			<-done
			return 0
		}
	}
}
