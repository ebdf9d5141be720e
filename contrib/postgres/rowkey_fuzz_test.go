package postgres_test

import (
	"bytes"
	"testing"

	"github.com/idemkit/idemhttp/contrib/postgres"
	"github.com/idemkit/idemhttp/idemserver"
)

// FuzzScopedRowKey: the middleware's one-allocation row key is the one
// the Store computes from the scoped key, for any scope and key.
func FuzzScopedRowKey(f *testing.F) {
	for _, s := range [][2]string{{"", "k"}, {"acct_1", "k"}, {"", "sha256:x"}, {"sha256:", "k"}, {string(make([]byte, 190)), "k"}, {"a", string(make([]byte, 300))}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, scope, key string) {
		want := postgres.RowKey(idemserver.ScopedKey(scope, key))
		if got := postgres.ScopedRowKey(scope, key); !bytes.Equal(got, want) {
			t.Fatalf("scope %q key %q: %q, want %q", scope, key, got, want)
		}
	})
}
