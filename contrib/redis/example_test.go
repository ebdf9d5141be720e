package redis_test

import (
	"context"
	"log"
	"net/http"

	goredis "github.com/redis/go-redis/v9"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

// The example needs a Redis server, so it is compiled but not run.

// Every instance of a service shares the store, so that a retry landing on
// another instance finds the first request's claim or response.
func ExampleNewStore() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "redis-primary:6379"}) // the primary
	defer rdb.Close()
	mw := &idemserver.Middleware{
		Store:     idemredis.NewStore(rdb, &idemredis.Options{Prefix: "billing:idem:"}),
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	}
	http.Handle("POST /v1/charges", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	log.Fatal(http.ListenAndServe(":8080", nil))
}

// Check the server's maxmemory-policy at start, so that a Redis that may
// evict records stops the service from starting rather than answering
// every request with 503.
func ExampleStore_CheckEvictionPolicy() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "redis-primary:6379"})
	defer rdb.Close()
	store := idemredis.NewStore(rdb, nil)
	if err := store.CheckEvictionPolicy(context.Background()); err != nil {
		log.Fatal(err) // for instance: maxmemory-policy is allkeys-lru on redis-primary:6379: ...
	}
	_ = &idemserver.Middleware{Store: store, Principal: func(r *http.Request) string { return r.Header.Get("X-Account") }}
}
