package redis_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

// TestNoEvictionNearMaxMemory: Redis under maxmemory-policy noeviction,
// near maxmemory (issue 30, §2.7). A claim that fits is followed by a
// Complete that Redis refuses (OOM: the memory filled while the handler
// ran). The key must then stay claimed, answering 409, for the TTL:
// never expire with its lock and run again. Renew (PEXPIRE) is not
// refused under OOM, so the middleware pins the claim for the TTL; and a
// claim of a new key, which would need memory, is refused with 503 (the
// store is full), the handler not run. Checked to fail with the pin
// removed (the Complete still retried): the key expired with its lock
// (503 while Redis was full), and ran a second time once memory was
// freed; and with the Store's read after a refused SET removed: the
// retries got 503 instead of 409 while Redis was full.
func TestNoEvictionNearMaxMemory(t *testing.T) {
	r := startPrivateRedis(t, "--maxmemory-policy", "noeviction")
	c := r.client(t)
	ctx := context.Background()
	used := func() int64 {
		info, err := c.Info(ctx, "memory").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no used_memory")
		return 0
	}
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used()+1<<20, 10)).Err())

	// fill writes values until Redis refuses one, then smaller ones (a
	// large value counts while it sits in the connection's buffer, and
	// Redis shrinks that buffer later): Redis is then past maxmemory, and
	// refuses every write that needs memory.
	fill := func() {
		i := 0
		for _, size := range []int{1 << 10, 16} {
			filler := strings.Repeat("f", size)
			for ; ; i++ {
				err := c.Set(ctx, fmt.Sprint("filler:", i), filler, 0).Err()
				if err != nil {
					require.Contains(t, err.Error(), "OOM")
					break
				}
				require.Less(t, i, 100000, "Redis never refused a write")
			}
		}
		// Redis frees a little once the writes are done (its connections'
		// buffers shrink, every 100 ms): set the limit well below what it
		// holds now, so that it stays past it whatever it frees (on a
		// loaded CI machine the Complete after the handler once found
		// room). Deleting the fillers frees ten times the margin.
		require.NoError(t, c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used()-100<<10, 10)).Err())
	}

	const lockTimeout = 300 * time.Millisecond
	var runs atomic.Int32
	mw := &idemserver.Middleware{
		Store:        idemredis.NewStore(c, nil),
		SingleTenant: true,
		LockTimeout:  lockTimeout,
		Logger:       slog.New(slog.DiscardHandler),
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.Header.Get("X-Fill") != "" {
			fill() // the memory fills while the handler runs
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, strings.Repeat("r", 8<<10))
	}))
	post := func(key string, fillMemory bool) int {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", key)
		if fillMemory {
			req.Header.Set("X-Fill", "1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}

	require.Equal(t, http.StatusCreated, post("k", true), "the response reaches its client")
	// Redis may free a little once the handler's writes are done (its
	// connections' buffers shrink): fill it again to the brim, so that
	// what follows meets a full Redis, as the refused Complete did. (On
	// CI the probe once succeeded without this.)
	fill()
	require.Error(t, c.Set(ctx, "probe", "1", 0).Err(), "Redis is past maxmemory")
	assert.Equal(t, http.StatusConflict, post("k", false), "the key stays claimed")
	time.Sleep(3 * lockTimeout) // past the lock timeout: waiting is the test
	assert.Equal(t, http.StatusConflict, post("k", false), "the key stays claimed past its lock: it never runs again")
	assert.Equal(t, int32(1), runs.Load(), "runs")
	ttl, err := c.PTTL(ctx, idemredis.DefaultPrefix+idemserver.ScopedKey("", "k")).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Hour, "pinned for the TTL")

	assert.Equal(t, http.StatusServiceUnavailable, post("new", false), "a claim that needs memory is refused")
	assert.Equal(t, int32(1), runs.Load(), "a refused claim runs nothing")

	// Memory freed: a new key runs; the pinned one still answers 409.
	iter := c.Scan(ctx, 0, "filler:*", 1000).Iterator()
	for iter.Next(ctx) {
		require.NoError(t, c.Del(ctx, iter.Val()).Err())
	}
	assert.Equal(t, http.StatusCreated, post("new", false))
	assert.Equal(t, http.StatusConflict, post("k", false))
}
