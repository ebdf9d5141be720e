package redis_test

import (
	"testing"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/internal/servertest"
)

// TestMiddlewareConformance: idemserver.Middleware on the Redis Store
// answers the shell suite's scenarios as the models do.
func TestMiddlewareConformance(t *testing.T) {
	c := newClient(t, 0)
	servertest.Run(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		return servertest.Streamed(app, idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)}))
	})
}

// TestMiddlewareLogs: idemserver.Middleware on the Redis Store logs no
// key in any of the shell suite's scenarios, error paths included.
// Checked to fail with the Redis store's corrupt-value error naming the
// key again (TestForeignValueLogsNoKey), and with the store-failed line
// logging "key", key.
func TestMiddlewareLogs(t *testing.T) {
	c := newClient(t, 0)
	servertest.RunLogs(t, func(t *testing.T, app *servertest.App) *servertest.Target {
		return servertest.Streamed(app, idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)}))
	})
}
