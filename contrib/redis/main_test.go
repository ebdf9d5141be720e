package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/internal/needs"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; the restart test fails many on
	// purpose.
	goredis.SetLogger(quiet{})
	goleak.VerifyTestMain(m)
}

// quiet is a go-redis logger that drops everything.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// addrEnv names the variable holding the test server's address;
// .ci/services.sh prints it.
const addrEnv = "IDEMHTTP_REDIS_ADDR"

// serverAddr returns the test server's address, or skips the test when
// none is set, for the test command's report; on CI (CI=true) a missing
// server fails instead, so that a broken setup cannot pass as a skip (see
// internal/needs).
func serverAddr(t testing.TB) string {
	t.Helper()
	a := os.Getenv(addrEnv)
	if a == "" {
		needs.Missing(t, "Redis: "+addrEnv+" is not set", needs.Services)
	}
	return a
}

// newClient returns a client of the test server, closed when the test
// ends.
func newClient(t testing.TB, poolSize int) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: serverAddr(t), PoolSize: poolSize})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(context.Background()).Err())
	return c
}

// newPrefix returns a key prefix no other test uses, and deletes its keys
// when the test ends.
func newPrefix(t testing.TB, c *goredis.Client) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b) // never fails (Go 1.24+)
	prefix := "idemtest:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			_ = c.Del(ctx, iter.Val()).Err()
		}
	})
	return prefix
}
