package postgres_test

import (
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
	"github.com/idemkit/idemhttp/journaltest"
)

func TestStoreConformance(t *testing.T) {
	serverURL(t)
	storetest.Run(t, func(t *testing.T) idemserver.Store {
		return postgres.NewStore(newSchema(t).pool(t, 0))
	})
}

func TestJournalConformance(t *testing.T) {
	serverURL(t)
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		// The suite checks the times it passes are kept.
		return postgres.NewJournal(newSchema(t).pool(t, 0), &postgres.JournalOptions{ClientClock: true})
	})
}
