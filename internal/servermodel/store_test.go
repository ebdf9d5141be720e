package servermodel_test

import (
	"testing"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
	"github.com/idemkit/idemhttp/internal/servermodel"
)

// TestStoreConformance: the modelled store keeps the Store contract, as
// every real store does.
func TestStoreConformance(t *testing.T) {
	storetest.RunWithClock(t, func(t *testing.T, now func() time.Time) idemserver.Store {
		return &servermodel.Store{Now: now}
	})
}
