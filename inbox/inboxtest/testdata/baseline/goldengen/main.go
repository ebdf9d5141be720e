//go:build ignore

// Command goldengen writes the golden data of the consumer formats of the
// previous release (commit 2d053bb): it runs that commit's inbox.SQL
// (SQLite and PostgreSQL), contrib/postgres Inbox and Outbox, and
// contrib/kafka SQLOffsets (SQLite and PostgreSQL) over a fixed set of
// messages, and leaves the databases for dumping (see the README beside
// the data). Run from a worktree of 2d053bb, in a module that requires
// those packages:
//
//	go run . -sqlite DIR -pg URL
//
// URL's search_path names three empty schemas by prefix: PREFIX_sql,
// PREFIX_pgx and PREFIX_kafka are created.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idemhttp/contrib/kafka"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
)

// Manifest lists what the previous release recorded, for the tests that
// read its data.
type Manifest struct {
	// Processed: consumer -> ids recorded by Process, ProcessBatch and
	// Handle (raw ids, before StoredID), each quoted as Go does
	// (strconv.Quote): an id need not be UTF-8.
	Processed map[string][]string `json:"processed"`
	// Offsets: group -> topic -> partition -> offsets processed.
	Offsets map[string]map[string]map[int32][]int64 `json:"offsets,omitempty"`
	// Outbox: ids added and not relayed.
	Outbox []string `json:"outbox,omitempty"`
}

func main() {
	dir := flag.String("sqlite", "", "directory for the SQLite databases")
	pgURL := flag.String("pg", "", "PostgreSQL URL (no search_path)")
	prefix := flag.String("prefix", "golden", "schema prefix")
	flag.Parse()
	ctx := context.Background()
	if err := run(ctx, *dir, *pgURL, *prefix); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

var longID = strings.Repeat("long-", 60) + "1" // 301 bytes: stored hashed

// processInbox runs the previous release's inbox.SQL over the fixed
// messages.
func processInbox(ctx context.Context, db *sql.DB) (Manifest, error) {
	m := Manifest{Processed: map[string][]string{}}
	in := &inbox.SQL{DB: db}
	if err := in.Migrate(ctx); err != nil {
		return m, err
	}
	noop := func(context.Context, *sql.Tx) error { return nil }
	for _, id := range []string{"order-1", "order-2", longID, "bin\xffary"} {
		if _, err := in.Process(ctx, "billing", id, noop); err != nil {
			return m, err
		}
		m.Processed["billing"] = append(m.Processed["billing"], id)
	}
	batch := []string{"batch-1", "batch-2", "batch-3"}
	if _, err := in.ProcessBatch(ctx, "billing", batch, func(context.Context, *sql.Tx, int) error { return nil }); err != nil {
		return m, err
	}
	m.Processed["billing"] = append(m.Processed["billing"], batch...)
	// Handle, as the adapters called it: the queue's messages under the
	// consumer's plain name.
	h := in.Handle("mailer", func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
	for _, id := range []string{"order-1", "mail-7"} {
		if err := h(ctx, &inbox.Message{ID: id, Source: "orders"}); err != nil {
			return m, err
		}
		m.Processed["mailer"] = append(m.Processed["mailer"], id)
	}
	return m, nil
}

// processOffsets runs the previous release's SQLOffsets over the fixed
// records.
func processOffsets(ctx context.Context, db *sql.DB) (map[string]map[string]map[int32][]int64, error) {
	o := &kafka.SQLOffsets{DB: db}
	if err := o.Migrate(ctx); err != nil {
		return nil, err
	}
	out := map[string]map[string]map[int32][]int64{"billing": {"orders": {}, "refunds": {}}}
	recs := []struct {
		topic     string
		partition int32
		offsets   int64
	}{{"orders", 0, 5}, {"orders", 1, 3}, {"refunds", 0, 2}}
	for _, r := range recs {
		for off := range r.offsets {
			rec := &kgo.Record{Topic: r.topic, Partition: r.partition, Offset: off}
			if _, err := o.Process(ctx, "billing", rec, func(context.Context, *sql.Tx) error { return nil }); err != nil {
				return nil, err
			}
			out["billing"][r.topic][r.partition] = append(out["billing"][r.topic][r.partition], off)
		}
	}
	return out, nil
}

func run(ctx context.Context, dir, pgURL, prefix string) error {
	// SQLite: the inbox and the offsets, each in a file of its own.
	lite, err := sqlite.Open(filepath.Join(dir, "inbox.db"))
	if err != nil {
		return err
	}
	m, err := processInbox(ctx, lite)
	lite.Close()
	if err != nil {
		return fmt.Errorf("sqlite inbox: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "inbox.json"), m); err != nil {
		return err
	}
	lite, err = sqlite.Open(filepath.Join(dir, "offsets.db"))
	if err != nil {
		return err
	}
	offs, err := processOffsets(ctx, lite)
	lite.Close()
	if err != nil {
		return fmt.Errorf("sqlite offsets: %w", err)
	}
	if err := writeJSON(filepath.Join(dir, "offsets.json"), Manifest{Offsets: offs}); err != nil {
		return err
	}
	if pgURL == "" {
		return nil
	}

	admin, err := sql.Open("pgx", pgURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, s := range []string{"_sql", "_pgx", "_kafka"} {
		if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+prefix+s); err != nil {
			return err
		}
	}
	with := func(s string) string { return pgURL + "&search_path=" + prefix + s }

	// PostgreSQL through database/sql: inbox.SQL's own table.
	db, err := sql.Open("pgx", with("_sql"))
	if err != nil {
		return err
	}
	if _, err := processInbox(ctx, db); err != nil {
		return fmt.Errorf("postgres inbox.SQL: %w", err)
	}
	db.Close()

	// PostgreSQL through pgx: postgres.Migrate's schema, the Inbox and the
	// Outbox.
	pool, err := pgxpool.New(ctx, with("_pgx"))
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}
	pm := Manifest{Processed: map[string][]string{}}
	in := postgres.NewInbox(pool)
	noop := func(context.Context, pgx.Tx) error { return nil }
	for _, id := range []string{"order-1", "order-2", longID} {
		if _, err := in.Process(ctx, "billing", id, noop); err != nil {
			return err
		}
		pm.Processed["billing"] = append(pm.Processed["billing"], id)
	}
	batch := []string{"batch-1", "batch-2"}
	if _, err := in.ProcessBatch(ctx, "billing", batch, func(context.Context, pgx.Tx, int) error { return nil }); err != nil {
		return err
	}
	pm.Processed["billing"] = append(pm.Processed["billing"], batch...)
	h := in.Handle("mailer", func(context.Context, pgx.Tx, *inbox.Message) error { return nil })
	if err := h(ctx, &inbox.Message{ID: "order-1", Source: "orders"}); err != nil {
		return err
	}
	pm.Processed["mailer"] = append(pm.Processed["mailer"], "order-1")
	ob := postgres.NewOutbox(pool)
	for i := range 2 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			id, err := ob.Add(ctx, tx, postgres.OutboxMessage{ID: fmt.Sprintf("out-%d", i), Topic: "orders", Key: []byte("k"),
				Body: []byte(fmt.Sprintf("body %d", i)), Header: map[string][]string{"trace": {"t-1"}}})
			pm.Outbox = append(pm.Outbox, id)
			return err
		})
		if err != nil {
			return err
		}
	}
	if err := writeJSON(filepath.Join(dir, "postgres.json"), pm); err != nil {
		return err
	}

	// PostgreSQL offsets.
	db, err = sql.Open("pgx", with("_kafka"))
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := processOffsets(ctx, db); err != nil {
		return fmt.Errorf("postgres offsets: %w", err)
	}
	return nil
}

func writeJSON(path string, v any) error {
	if m, ok := v.(Manifest); ok {
		for c, ids := range m.Processed {
			q := make([]string, len(ids))
			for i, id := range ids {
				q[i] = strconv.Quote(id)
			}
			m.Processed[c] = q
		}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
