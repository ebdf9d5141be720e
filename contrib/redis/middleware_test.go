package redis_test

import (
	"github.com/idemkit/idemhttp/internal/storeharness"
	"net/http/httptest"
	"testing"
	"time"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
)

// TestMiddlewareInstancesShareStore runs 200 requests with one key across
// four middleware instances (as four processes of one service would be)
// sharing the store: the effect runs once.
func TestMiddlewareInstancesShareStore(t *testing.T) {
	c := newClient(t, 0)
	store := idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)})
	e := storeharness.NewEffects()
	servers := make([]*httptest.Server, 4)
	for i := range servers {
		servers[i] = storeharness.Serve(t, store, e, time.Minute, nil)
	}
	storeharness.SharedKeyRace(t, servers, e, 200)
}
