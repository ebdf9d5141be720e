package idemserver_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/idemserver"
)

// otherStore is a Store that is not a *MemoryStore.
type otherStore struct{ *idemserver.MemoryStore }

// TestMemoryStoreLogsCapacityOnce (issue 34 §5): a memory store says at
// start, once, through the Middleware's logger, what it holds and for how
// long, and where to go past it; a shared store says nothing. Checked to
// fail with announce's once removed (two lines for one store), and with
// build not calling it (none).
func TestMemoryStoreLogsCapacityOnce(t *testing.T) {
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	tests := []struct {
		name      string
		giveStore func() idemserver.Store
		giveTTL   time.Duration
		wraps     int
		wantLines int
		want      []string
	}{
		{"default store", func() idemserver.Store { return nil }, 0, 1, 1,
			[]string{"max_entries=1048576", "max_bytes=1073741824", "ttl=24h0m0s", "keys_per_second=12",
				"up to 1048576 records and 1 GiB, each kept 24h0m0s: about 12 new keys a second",
				"new keys get 503", "contrib/postgres or contrib/redis"}},
		{"one store, two routes", func() idemserver.Store { return &idemserver.MemoryStore{MaxEntries: 3600} }, time.Hour, 2, 1,
			[]string{"up to 3600 records and 1 GiB, each kept 1h0m0s: about 1.0 new keys a second"}},
		{"no bounds", func() idemserver.Store { return &idemserver.MemoryStore{MaxEntries: -1, MaxBytes: -1} }, 0, 1, 1,
			[]string{"with no bound"}},
		{"a shared store", func() idemserver.Store { return otherStore{new(idemserver.MemoryStore)} }, 0, 1, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			mw := &idemserver.Middleware{
				SingleTenant: true,
				Store:        tt.giveStore(),
				TTL:          tt.giveTTL,
				Logger:       slog.New(slog.NewTextHandler(&buf, nil)),
			}

			for range tt.wraps {
				mw.Wrap(ok)
			}

			out := buf.String()
			assert.Equal(t, tt.wantLines, strings.Count(out, "\n"), out)
			for _, want := range tt.want {
				assert.Contains(t, out, want)
			}
			if tt.wantLines > 0 {
				assert.Contains(t, out, "level=INFO")
			}
		})
	}
}

// The memory store (the default Store) says at start, once, what it
// holds and for how long, through the Middleware's logger.
func ExampleMemoryStore_capacity() {
	noTime := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{ReplaceAttr: noTime}))
	mw := &idemserver.Middleware{
		SingleTenant: true,
		Store:        &idemserver.MemoryStore{MaxEntries: 100_000},
		TTL:          time.Hour,
		Logger:       logger,
	}
	mw.Wrap(http.NotFoundHandler())
	mw.Wrap(http.NotFoundHandler()) // the same store: said once
	// Output:
	// level=INFO msg="idemserver: idempotency keys are kept in this process's memory (MemoryStore), up to 100000 records and 1 GiB, each kept 1h0m0s: about 28 new keys a second; past that, new keys get 503 until records expire, and a restart forgets them all. For more, or for several server instances, use a shared store: contrib/postgres or contrib/redis" max_entries=100000 max_bytes=1073741824 ttl=1h0m0s max_scope_entries=25000 max_scope_bytes=268435456 keys_per_second=28
}
