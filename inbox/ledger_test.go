package inbox_test

import (
	"testing"

	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// The memory ledger answers as the durable ones do (contrib/sqlite and
// contrib/postgres run the same suite on theirs).
func TestMemoryLedgerConformance(t *testing.T) {
	inboxtest.RunLedger(t, func(*testing.T) inboxtest.LedgerFixture {
		return inboxtest.LedgerFixture{Ledger: &inbox.MemoryLedger{}}
	})
}
