package kafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

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
