package rabbitmq_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"os/signal"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idemhttp/contrib/rabbitmq"
	"github.com/idemkit/idemhttp/inbox"
)

// The example needs a RabbitMQ broker and a database, so it is compiled
// but not run.

// A consumer that records each order once, however often RabbitMQ
// delivers it: the inbox row and the order row commit together, and the
// delivery is acked after the commit. Producers set each message's
// message-id property to the order's id, the same on every publish of it.
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
	handle := in.Handle("order-recorder", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.ID, m.Body)
		return err
	})

	// Automatic recovery stays off (amqp.Config.Recovery nil): on a lost
	// connection Run returns, and this loop dials again.
	for ctx.Err() == nil {
		conn, err := amqp.Dial(os.Getenv("AMQP_URL"))
		if err != nil {
			log.Print(err)
			select { // in production: an exponential backoff
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		ch, err := conn.Channel()
		if err == nil {
			c := &rabbitmq.Consumer{
				Queue:    "orders", // declared with x-dead-letter-exchange: poison messages and messages with no id go there
				Prefetch: 64,
				// The inbox's count of each message's failed runs, shared by
				// every instance: shutdowns never count, crashes do.
				Ledger: in.Ledger("order-recorder"),
				OnDeadLetter: func(d inbox.DeadLetter) {
					// Also logged; count it in your metrics.
				},
			}
			err = c.Run(ctx, ch, handle)
		}
		_ = conn.Close()
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Print(err)
		}
	}
}
