package sqlite_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/contrib/sqlite"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	inboxtest.Run(t, func(t *testing.T) *sql.DB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}

func TestOpenSettings(t *testing.T) {
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
	require.NoError(t, err)
	defer db.Close()
	var mode string
	var sync, busy int
	require.NoError(t, db.QueryRow("PRAGMA journal_mode").Scan(&mode))
	require.NoError(t, db.QueryRow("PRAGMA synchronous").Scan(&sync))
	require.NoError(t, db.QueryRow("PRAGMA busy_timeout").Scan(&busy))
	assert.Equal(t, "wal", mode)
	assert.Equal(t, 2, sync, "FULL")
	assert.Equal(t, 10000, busy)

	_, err = sqlite.Open(filepath.Join(t.TempDir(), "x.db?mode=ro"))
	assert.Error(t, err)
	_, err = sqlite.Open(filepath.Join(t.TempDir(), "missing-dir", "x.db"))
	assert.Error(t, err)
}

// TestUpgrade runs the upgrade suite on the previous release's SQLite
// inbox: inbox.SQL's own tests on a real driver.
func TestUpgrade(t *testing.T) {
	inboxtest.RunUpgrade(t, "sqlite", func(t *testing.T) *sql.DB {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}

// TestLedgerConformance runs the ledger suite on inbox.SQL's ledger, whose
// processed messages are those its Handle recorded.
func TestLedgerConformance(t *testing.T) {
	inboxtest.RunLedger(t, func(t *testing.T) inboxtest.LedgerFixture {
		db, err := sqlite.Open(filepath.Join(t.TempDir(), "inbox.db"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		in := &inbox.SQL{DB: db}
		require.NoError(t, in.Migrate(context.Background()))
		h := in.Handle("billing", func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
		return inboxtest.LedgerFixture{
			Ledger: in.Ledger("billing"),
			Process: func(ctx context.Context, k inbox.Key) error {
				return h(ctx, &inbox.Message{ID: k.ID, IDSpace: k.IDSpace})
			},
			Redrive: in.Ledger("billing").Redrive,
		}
	})
}
