package postgres_test

import (
	"strconv"
	"testing"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/storeharness"
)

// BenchmarkClaimComplete measures a request's store round trips (Claim of
// a new key, then Complete with a small response) at concurrency 1 and 64,
// beside the in-process MemoryStore as the baseline.
func BenchmarkClaimComplete(b *testing.B) {
	stores := []struct {
		name string
		new  func(b *testing.B, conns int32) idemserver.Store
	}{
		{"memory", func(*testing.B, int32) idemserver.Store { return &idemserver.MemoryStore{} }},
		{"postgres", func(b *testing.B, conns int32) idemserver.Store {
			return newStore(b, newSchema(b).pool(b, conns))
		}},
	}
	for _, st := range stores {
		for _, conc := range []int{1, 64} {
			b.Run(st.name+"/c"+strconv.Itoa(conc), func(b *testing.B) {
				storeharness.BenchClaimComplete(b, st.new(b, int32(conc)), conc)
			})
		}
	}
}
