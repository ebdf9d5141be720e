package postgres

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what [Store], [Journal] and [Migrate] need from PostgreSQL: a
// [*pgxpool.Pool] has it. It must be safe for concurrent use (a single
// [*pgx.Conn] is not) and must reach the primary: see the package
// documentation.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

var _ DB = (*pgxpool.Pool)(nil)

//go:embed schema.sql
var schema string

// migrateLock is the key of the transaction-level advisory lock Migrate
// holds, so that a fleet starting at once applies the schema one process at
// a time: concurrent CREATE TABLE IF NOT EXISTS statements can otherwise
// fail with a unique violation in the catalog. The value is arbitrary
// ("idemhttp" in ASCII).
const migrateLock int64 = 0x69_64_65_6d_68_74_74_70

// Schema returns the SQL that [Migrate] applies (the embedded schema.sql),
// for migration tools that manage the schema themselves.
func Schema() string { return schema }

// Migrate creates the tables and indexes of [Store] and [Journal] if they
// do not exist, in the first schema on db's search_path, in one
// transaction. It is idempotent and safe to call from many processes at
// once: every worker may call it at start-up.
func Migrate(ctx context.Context, db DB) error {
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLock); err != nil {
			return err
		}
		// No arguments, so pgx sends the file with the simple protocol,
		// which runs several statements in one call.
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemhttp/postgres: migrate: %w", err)
	}
	return nil
}
