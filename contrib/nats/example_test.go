package nats_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"os/signal"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsinbox "github.com/idemkit/idemhttp/contrib/nats"
	"github.com/idemkit/idemhttp/inbox"
)

// The example needs a NATS server with JetStream and a database, so it is
// compiled but not run.

// A consumer that records each order once, however often JetStream
// delivers it: the inbox row and the order row commit together, and the
// message is acked after the commit. Producers publish with
// jetstream.WithMsgID(orderID), the same on every publish of an order.
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

	nc, err := nats.Connect(os.Getenv("NATS_URL")) // reconnects by itself
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:    "order-recorder",
		AckPolicy:  jetstream.AckExplicitPolicy,
		MaxDeliver: 20, // then the server gives up on a message that always fails
	})
	if err != nil {
		log.Fatal(err)
	}

	handle := in.Handle("order-recorder", func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.ID, m.Body)
		return err
	})
	// The inbox's count of each message's failed runs, shared by every
	// instance: shutdowns never count, crashes do.
	err = (&natsinbox.Consumer{Ledger: in.Ledger("order-recorder")}).Run(ctx, cons, handle)
	log.Print(err) // context.Canceled after ^C
}
