package suite

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The crash tests and the benchmarks start this test binary again as a
	// child; it must do its part and exit before any test runs.
	MaybeRunChild()
	goleak.VerifyTestMain(m)
}
