package inbox_test

import (
	"context"
	"testing"

	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// The memory ledger answers as the durable ones do. inbox.SQL itself, its
// ledger and its upgrade from the previous release run on real drivers in
// the tests of contrib/sqlite (embedded SQLite) and contrib/postgres
// (PostgreSQL): inboxtest.Run, RunLedger and RunUpgrade; the root module
// holds no driver.
func TestMemoryLedgerConformance(t *testing.T) {
	inboxtest.RunLedger(t, func(*testing.T) inboxtest.LedgerFixture {
		return inboxtest.LedgerFixture{Ledger: &inbox.MemoryLedger{}}
	})
}

// The model's ledger (inboxtest.Store, which the model world and the
// runner's tests use) answers as the real ones do, processed messages
// included.
func TestStoreLedgerConformance(t *testing.T) {
	inboxtest.RunLedger(t, func(*testing.T) inboxtest.LedgerFixture {
		store := inboxtest.NewStore()
		return inboxtest.LedgerFixture{Ledger: store.Ledger(), Process: func(_ context.Context, k inbox.Key) error {
			tx, _, err := store.Begin(k)
			if err != nil {
				return err
			}
			return tx.Commit()
		}, Redrive: store.Redrive}
	})
}
