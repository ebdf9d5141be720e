package kafka_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
)

// A consumer group whose handler records each message id in the ledger
// row's transaction: the producer wrote order-1 twice (a retry after a
// lost acknowledgement, same message-id header), and the ledger gets it
// once. The cluster is franz-go's in-process kfake; the database an
// embedded SQLite.
func ExampleNewConsumer() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()[0]

	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	var recs []*kgo.Record
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		recs = append(recs, &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: kafka.DefaultIDHeader, Value: []byte(id)}}})
	}
	err = producer.ProduceSync(ctx, recs...).FirstErr()
	producer.Close()
	if err != nil {
		fmt.Println(err)
		return
	}

	dir, err := os.MkdirTemp("", "kafka-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	in := &inbox.SQL{DB: db}
	if err := in.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := db.Exec("CREATE TABLE ledger (order_id text NOT NULL)"); err != nil {
		fmt.Println(err)
		return
	}

	seen := 0
	c, err := kafka.NewConsumer(kafka.Config{
		Group:  "ledger",
		Topics: []string{"orders"},
		Ledger: in.Ledger("ledger"), // failed runs, counted in the database
		Handler: func(ctx context.Context, m *inbox.Message) error {
			res, err := in.Process(ctx, "ledger", m.ID, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO ledger (order_id) VALUES ($1)", m.ID)
				return err
			})
			if err != nil {
				return err // not committed: redelivered
			}
			fmt.Printf("%s at %s: duplicate=%v\n", m.ID, m.Source, res.Duplicate)
			if seen++; seen == len(recs) {
				cancel()
			}
			return nil // the offset is committed after this
		},
	}, kgo.SeedBrokers(seeds), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	_ = c.Run(ctx) // until cancel

	var rows int
	_ = db.QueryRow("SELECT count(*) FROM ledger").Scan(&rows)
	fmt.Println("ledger rows:", rows)
	// Output:
	// order-1 at orders/0: duplicate=false
	// order-2 at orders/0: duplicate=false
	// order-1 at orders/0: duplicate=true
	// ledger rows: 2
}

// A record whose handler always fails (a payload it cannot parse) is
// retried, after growing delays, then moved to a dead-letter topic with
// where it came from and why, and reported; the partition goes on. The
// cluster is franz-go's in-process kfake.
func ExampleConfig_deadLetterTopic() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders", "orders-dlq"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	seeds := cluster.ListenAddrs()[0]
	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer producer.Close()
	var recs []*kgo.Record
	for _, body := range []string{`{"id":"order-1"}`, `{"id":`, `{"id":"order-3"}`} {
		recs = append(recs, &kgo.Record{Value: []byte(body), Headers: []kgo.RecordHeader{{Key: kafka.DefaultIDHeader, Value: []byte(body)}}})
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		fmt.Println(err)
		return
	}

	handled := 0
	c, err := kafka.NewConsumer(kafka.Config{
		Group: "ledger", Topics: []string{"orders"},
		Handler: func(ctx context.Context, m *inbox.Message) error {
			var order struct{ ID string }
			if err := json.Unmarshal(m.Body, &order); err != nil {
				return err // retried, then dead-lettered
			}
			fmt.Println("recorded", order.ID)
			if handled++; handled == 2 {
				cancel()
			}
			return nil
		},
		DeadLetterTopic: "orders-dlq",
		Retry:           inbox.Retry{Delay: time.Millisecond, MaxDeliveries: 3},
		OnDeadLetter: func(d inbox.DeadLetter) {
			fmt.Printf("%s offset %d: dead-lettered to %s after %d deliveries: %v\n",
				d.Message.Source, d.Message.Raw.(*kgo.Record).Offset, d.To, d.Deliveries, d.Err)
		},
		Logger: slog.New(slog.DiscardHandler), // the report is also logged
	}, kgo.SeedBrokers(seeds), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	_ = c.Run(ctx) // until cancel

	// The dead-letter topic holds the record, with its origin.
	reader, err := kgo.NewClient(kgo.SeedBrokers(seeds), kgo.ConsumeTopics("orders-dlq"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer reader.Close()
	for _, r := range reader.PollFetches(context.Background()).Records() {
		fmt.Printf("in orders-dlq: %s", r.Value)
		for _, h := range r.Headers {
			if h.Key == kafka.HeaderDeadLetterOffset {
				fmt.Printf(" (from offset %s)\n", h.Value)
			}
		}
	}
	// Output:
	// recorded order-1
	// orders/0 offset 1: dead-lettered to topic orders-dlq after 3 deliveries: unexpected end of JSON input
	// recorded order-3
	// in orders-dlq: {"id": (from offset 1)
}
