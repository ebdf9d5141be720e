package redis_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

// TestExpiryIsNative checks that claims and responses carry Redis TTLs
// (lock timeout, then the response's TTL), so that Redis itself deletes
// them and nothing needs pruning.
func TestExpiryIsNative(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, 0)
	prefix := newPrefix(t, c)
	s := idemredis.NewStore(c, &idemredis.Options{Prefix: prefix})

	res, err := s.Claim(ctx, "k", idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Minute})
	require.NoError(t, err)
	require.Equal(t, idemserver.Claimed, res.State)
	ttl := c.PTTL(ctx, prefix+"k").Val()
	assert.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 5, "a claim lives for the lock timeout")

	require.NoError(t, s.Complete(ctx, "k", "t1", []byte("record"), time.Hour))
	ttl = c.PTTL(ctx, prefix+"k").Val()
	assert.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 5, "a response lives for its TTL")

	// A claim of 1 ms, rounded up from 1 µs rather than down to nothing,
	// is gone from Redis, not merely invisible, once it expires.
	res, err = s.Claim(ctx, "short", idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Microsecond})
	require.NoError(t, err)
	require.Equal(t, idemserver.Claimed, res.State)
	require.Eventually(t, func() bool { return c.Exists(ctx, prefix+"short").Val() == 0 },
		time.Second, time.Millisecond)
}

// TestClaimRecognisesOwnToken pins what makes go-redis's resend of a
// Claim whose reply was lost safe: finding its own token, the Claim
// reports Claimed rather than leaving its own request waiting for 409s.
func TestClaimRecognisesOwnToken(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, 0)
	s := idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)})
	claim := idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Minute}
	for range 2 {
		res, err := s.Claim(ctx, "k", claim)
		require.NoError(t, err)
		assert.Equal(t, idemserver.ClaimResult{State: idemserver.Claimed}, res)
	}
	require.NoError(t, s.Complete(ctx, "k", "t1", []byte("r"), time.Minute))
}

// TestForeignValue checks that a key holding something the store did not
// write is an error, not a claim or a response.
func TestForeignValue(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, 0)
	prefix := newPrefix(t, c)
	s := idemredis.NewStore(c, &idemredis.Options{Prefix: prefix})
	tests := []struct {
		give string
		want string
	}{
		{give: "hello", want: "not an idemhttp record"},
		{give: "C9:short", want: "not an idemhttp record"},
		{give: "R:x", want: "not an idemhttp record"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			require.NoError(t, c.Set(ctx, prefix+"k", tt.give, time.Minute).Err())
			_, err := s.Claim(ctx, "k", idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Minute})
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// TestDefaultPrefix checks where keys go when no prefix is set.
func TestDefaultPrefix(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, 0)
	s := idemredis.NewStore(c, nil)
	key := "idemtest-default-prefix-" + newPrefix(t, c)
	t.Cleanup(func() { c.Del(ctx, idemredis.DefaultPrefix+key) })
	_, err := s.Claim(ctx, key, idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Minute})
	require.NoError(t, err)
	assert.Equal(t, int64(1), c.Exists(ctx, idemredis.DefaultPrefix+key).Val())
}

// TestForeignValueLogsNoKey: a key holding something the store did not
// write answers 503, and the log line says so without the key (the Redis
// store's error named it, and went to the log with the request). Checked
// to fail with the claim's error naming s.prefix+key again.
func TestForeignValueLogsNoKey(t *testing.T) {
	const key = "op-7f3a-9c1d-not-for-logs"
	ctx := context.Background()
	c := newClient(t, 0)
	prefix := newPrefix(t, c)
	require.NoError(t, c.Set(ctx, prefix+idemserver.ScopedKey("", key), "hello", time.Minute).Err())
	var log strings.Builder
	h := (&idemserver.Middleware{
		SingleTenant: true, RetryAfter: -1,
		Store:  idemredis.NewStore(c, &idemredis.Options{Prefix: prefix}),
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, log.String(), "not an idemhttp record")
	assert.Contains(t, log.String(), "key_digest="+idemserver.KeyDigest(key))
	assert.NotContains(t, log.String(), key)
}
