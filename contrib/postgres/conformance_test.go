package postgres_test

import (
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
	"github.com/idemkit/idemhttp/journaltest"
)

var (
	_ journaltest.FleetJournal = (*postgres.Journal)(nil)
	_ journaltest.ClockJournal = (*postgres.Journal)(nil)
	_ journaltest.Clock        = (*postgres.Journal)(nil)
	_ journaltest.Forgetter    = (*postgres.Journal)(nil)
)

func TestStoreConformance(t *testing.T) {
	serverURL(t)
	storetest.Run(t, func(t *testing.T) idemserver.Store {
		return newStore(t, newSchema(t).pool(t, 0))
	})
}

func TestJournalConformance(t *testing.T) {
	serverURL(t)
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		// The default: the database's clock, which keeps the (earlier)
		// times the suite passes.
		return postgres.NewJournal(newSchema(t).pool(t, 0), nil)
	})
}

// TestJournalFleetConformance runs the fleet section in the default mode,
// the database's clock: the schema's now() is the server's plus an offset
// that Shift moves (see skewClock), so that leases expire and the clock
// runs ahead or behind without waiting, as it would for every worker
// sharing the database.
func TestJournalFleetConformance(t *testing.T) {
	serverURL(t)
	journaltest.RunFleet(t, func(t *testing.T) *journaltest.Fleet {
		s := newSchema(t)
		shift := s.skewClock(t)
		const lease = time.Minute
		return &journaltest.Fleet{
			A:         postgres.NewJournal(s.skewedPool(t, 0), &postgres.JournalOptions{Worker: "a", Lease: lease}),
			B:         postgres.NewJournal(s.skewedPool(t, 0), &postgres.JournalOptions{Worker: "b", Lease: lease}),
			Lease:     lease,
			Retention: 24 * time.Hour, // the clients' Policy.Retention, which they tell the journals
			Shift:     shift,
		}
	})
}
