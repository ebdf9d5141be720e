// Package sqlite opens an embedded SQLite database (modernc.org/sqlite,
// pure Go, no cgo) set up for [github.com/idemkit/idemhttp/inbox.SQL]: the default store of the
// consumer examples, and a real choice for a single-process consumer that
// keeps its business data in SQLite.
//
//	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
//	...
//	in := &inbox.SQL{DB: db}
//	if err := in.Migrate(ctx); err != nil { ... }
//	_, err = in.Process(ctx, "billing", m.ID, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "INSERT INTO ledger ...")
//		return err
//	})
//
// It lives in its own module so that the SQLite engine (a large
// dependency) stays out of idemhttp's go.mod: only those who import it pay
// for it.
package sqlite

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Open opens (creating if needed) the SQLite database at path, with the
// settings the inbox relies on:
//
//   - BEGIN IMMEDIATE (the _txlock=immediate setting): a transaction takes
//     the database's write lock when it begins, so two consumers never both
//     read and then fail to upgrade (SQLITE_BUSY without waiting);
//   - busy_timeout of 10 s: a transaction waits that long for the write
//     lock instead of failing at once;
//   - journal_mode=WAL: readers do not block the writer;
//   - synchronous=FULL: a commit is on disk when it returns. The inbox acks
//     after the commit; with synchronous=NORMAL (WAL's usual setting) a
//     power cut could lose a committed, acked transaction, effect and id
//     together, and the broker would not redeliver it: a lost message.
//   - foreign_keys=ON.
//
// path must not contain '?' (it would start the settings). Close the
// database when done.
func Open(path string) (*sql.DB, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, errors.New("idemhttp/sqlite: open: path must be non-empty and without '?' or '#'")
	}
	dsn := "file:" + path + "?_txlock=immediate" +
		"&_pragma=busy_timeout(10000)" +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(FULL)" +
		"&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/sqlite: open: %w", err)
	}
	// Connect now, so that a bad path fails here rather than at the first
	// message.
	if err := db.Ping(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("idemhttp/sqlite: open %s: %w", path, err)
	}
	return db, nil
}
