package inbox_test

import (
	"testing"

	"github.com/idemkit/idemhttp/inbox/inboxtest"
)

// The model pinned to itself: the scenarios run, and two model adapters
// agree (each real adapter's tests pin it to the model the same way).
func TestModelAdapterConformance(t *testing.T) {
	inboxtest.RunAdapter(t, func(*testing.T) inboxtest.Adapter { return inboxtest.NewModelAdapter() })
}
