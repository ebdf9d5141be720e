package redis_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

var testClaim = idemserver.Claim{Token: "t", Fingerprint: "fp", LockTimeout: time.Minute}

// TestEvictionPolicyChecked: a store refuses to claim on a server whose
// maxmemory-policy may evict its records (every policy but noeviction:
// all its keys carry TTLs, so volatile-* can evict them too), unless
// AllowEviction says the risk is accepted. It runs on a private server,
// since CONFIG SET on the shared one would change other tests' server.
// (Checked to fail with the check removed from Claim: allkeys-lru and
// volatile-ttl claimed.)
func TestEvictionPolicyChecked(t *testing.T) {
	ctx := context.Background()
	r := startPrivateRedis(t)
	admin := r.client(t)
	policies := []struct {
		give      string
		wantRefus bool
	}{
		{"noeviction", false},
		{"allkeys-lru", true},
		{"allkeys-lfu", true},
		{"allkeys-random", true},
		{"volatile-lru", true},
		{"volatile-lfu", true},
		{"volatile-random", true},
		{"volatile-ttl", true},
	}
	for _, tt := range policies {
		t.Run(tt.give, func(t *testing.T) {
			require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", tt.give).Err())
			s := idemredis.NewStore(r.client(t), nil)
			_, err := s.Claim(ctx, tt.give, testClaim)
			if !tt.wantRefus {
				assert.NoError(t, err)
				assert.NoError(t, s.CheckEvictionPolicy(ctx))
				return
			}
			assert.ErrorIs(t, err, idemredis.ErrEvictionPolicy)
			var pe *idemredis.EvictionPolicyError
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tt.give, pe.Policy)
			assert.Equal(t, r.sock, pe.Addr)
			assert.Contains(t, err.Error(), "AllowEviction")
			assert.Zero(t, admin.Exists(ctx, idemredis.DefaultPrefix+tt.give).Val(), "nothing was claimed")

			allowed := idemredis.NewStore(r.client(t), &idemredis.Options{AllowEviction: true})
			res, err := allowed.Claim(ctx, tt.give, testClaim)
			require.NoError(t, err, "the opt-in skips the check")
			assert.Equal(t, idemserver.Claimed, res.State)
			assert.ErrorIs(t, allowed.CheckEvictionPolicy(ctx), idemredis.ErrEvictionPolicy, "an explicit check still reports")
		})
	}

	t.Run("fixed after a refusal", func(t *testing.T) {
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err())
		s := idemredis.NewStore(r.client(t), nil)
		_, err := s.Claim(ctx, "later", testClaim)
		require.ErrorIs(t, err, idemredis.ErrEvictionPolicy)
		require.NoError(t, admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
		_, err = s.Claim(ctx, "later", testClaim)
		assert.NoError(t, err, "a refusal is not cached")
	})
}

// TestEvictionPolicyUnreadable: a server that refuses CONFIG GET (managed
// services rename it) cannot be checked, so claims are refused until the
// operator opts in.
func TestEvictionPolicyUnreadable(t *testing.T) {
	ctx := context.Background()
	r := startPrivateRedis(t, "--rename-command", "CONFIG", "")
	s := idemredis.NewStore(r.client(t), nil)
	_, err := s.Claim(ctx, "k", testClaim)
	var pe *idemredis.EvictionPolicyError
	require.ErrorAs(t, err, &pe)
	assert.Empty(t, pe.Policy)
	var reply goredis.Error
	assert.ErrorAs(t, err, &reply, "the server's refusal is kept")
	assert.Contains(t, err.Error(), "cannot read maxmemory-policy")

	allowed := idemredis.NewStore(r.client(t), &idemredis.Options{AllowEviction: true})
	_, err = allowed.Claim(ctx, "k", testClaim)
	assert.NoError(t, err)
}

// TestEvictionPolicyRefusalIs503: behind the middleware, a refused check
// is a 503 and the handler does not run.
func TestEvictionPolicyRefusalIs503(t *testing.T) {
	ctx := context.Background()
	r := startPrivateRedis(t, "--maxmemory-policy", "volatile-lru")
	var ran bool
	mw := &idemserver.Middleware{SingleTenant: true, Store: idemredis.NewStore(r.client(t), nil), Logger: slog.New(slog.DiscardHandler)}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		ran = true
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("{}")).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, w.Body.String(), idemserver.TypeStoreUnavailable)
	assert.False(t, ran)
}
