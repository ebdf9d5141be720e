package redis_test

import (
	"testing"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
)

func TestStoreConformance(t *testing.T) {
	c := newClient(t, 0)
	storetest.Run(t, func(t *testing.T) idemserver.Store {
		return idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)})
	})
}
