package journaltest_test

import (
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

// TestFleetModel runs the fleet section against the FleetModel, the
// contract as a model (which the simulator's fleet runs on), so that the
// suite is known to pass an implementation other than the PostgreSQL one,
// to ask nothing of it beyond its contract, and so that the model keeps
// every rule the suite holds the real journal to.
func TestFleetModel(t *testing.T) {
	journaltest.RunFleet(t, func(t *testing.T) *journaltest.Fleet {
		m := journaltest.NewFleetModel(&journaltest.FleetModelOptions{Lease: time.Minute})
		const retention = 24 * time.Hour
		a, b := m.Worker("a"), m.Worker("b")
		a.Retain(retention)
		b.Retain(retention)
		return &journaltest.Fleet{A: a, B: b, Lease: m.Lease(), Retention: retention, Shift: m.Shift}
	})
}

// TestFleetModelConformance: the model's workers are journals too.
func TestFleetModelConformance(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		return journaltest.NewFleetModel(nil).Worker("a")
	})
}
