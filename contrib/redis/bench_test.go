package redis_test

import (
	"github.com/idemkit/idemhttp/internal/storeharness"
	"strconv"
	"testing"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
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
		{"redis", func(b *testing.B, conns int32) idemserver.Store {
			c := newClient(b, int(conns))
			return idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(b, c)})
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
