package sqs_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	sqsinbox "github.com/idemkit/idemhttp/contrib/sqs"
	"github.com/idemkit/idemhttp/inbox"
)

// The example needs an SQS queue, AWS credentials and a database, so it
// is compiled but not run.

// A consumer that records each order once, however often SQS delivers it,
// and however often the producer sent it: producers set the message
// attribute idem-id to the order's id, the same on every send of it.
func ExampleConsumer_Run() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // import _ "github.com/jackc/pgx/v5/stdlib"
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	in := &inbox.SQL{DB: db}
	if err := in.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	// In production: cfg, err := config.LoadDefaultConfig(ctx), from
	// github.com/aws/aws-sdk-go-v2/config.
	cfg := aws.Config{Region: os.Getenv("AWS_REGION")}

	handle := in.Handle("order-recorder", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.ID, m.Body)
		return err
	})
	c := &sqsinbox.Consumer{
		QueueURL:    os.Getenv("QUEUE_URL"), // with a redrive policy to a dead-letter queue: Run refuses one without
		IDAttribute: "idem-id",
		Ledger:      in.Ledger("order-recorder"), // the retry delays grow with the inbox's count of failures
		OnDeadLetter: func(d inbox.DeadLetter) {
			// Also logged; count it in your metrics.
		},
		OnSettleError: func(id string, err error) {
			log.Printf("message %s: %v (it will come back; the inbox turns it away)", id, err)
		},
	}
	err = c.Run(ctx, sqs.NewFromConfig(cfg), handle)
	log.Print(err) // context.Canceled after ^C
}
