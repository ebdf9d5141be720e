package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
)

// A consumer's effect (a ledger row) and its inbox record commit in one
// transaction: the second delivery of the same message runs nothing.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "inbox-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	ctx := context.Background()
	in := &inbox.SQL{DB: db}
	if err := in.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := db.Exec("CREATE TABLE ledger (message_id text NOT NULL, amount integer NOT NULL)"); err != nil {
		fmt.Println(err)
		return
	}

	m := &inbox.Message{ID: "order-42", Body: []byte("2000")}
	for delivery := 1; delivery <= 2; delivery++ { // the broker redelivers
		res, err := in.Process(ctx, "ledger", m.ID, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO ledger (message_id, amount) VALUES ($1, $2)", m.ID, string(m.Body))
			return err
		})
		if err != nil {
			fmt.Println(err) // do not ack
			continue
		}
		fmt.Printf("delivery %d: duplicate=%v\n", delivery, res.Duplicate) // ack
	}
	var rows int
	_ = db.QueryRow("SELECT count(*) FROM ledger").Scan(&rows)
	fmt.Println("ledger rows:", rows)
	// Output:
	// delivery 1: duplicate=false
	// delivery 2: duplicate=true
	// ledger rows: 1
}
