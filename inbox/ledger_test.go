package inbox_test

import (
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
