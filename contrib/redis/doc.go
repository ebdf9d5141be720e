// Package redis keeps idemserver's idempotency records in Redis: [Store],
// an [idemserver.Store] that every instance of a service shares.
//
// It lives in its own module so that idemhttp's core does not depend on
// go-redis. Import it under another name, since go-redis is package redis
// too:
//
//	import (
//		goredis "github.com/redis/go-redis/v9"
//		idemredis "github.com/idemkit/idemhttp/contrib/redis"
//	)
//
//	rdb := goredis.NewClient(&goredis.Options{Addr: "redis-primary:6379"})
//	store := idemredis.NewStore(rdb, nil)
//	if err := store.CheckEvictionPolicy(ctx); err != nil {
//		log.Fatal(err) // maxmemory-policy is not noeviction
//	}
//	mw := &idemserver.Middleware{Store: store, Principal: accountOf}
//
// # Commands
//
// Each key ("idemhttp:" and the middleware's scoped key) holds one string.
// Claim is a single SET key claim NX PX lockTimeout GET (Redis 7.0 or
// later): it records the claim, or returns what the key holds, in one
// atomic command. Complete, Renew and Release are Lua scripts, so that the
// token check and the write are atomic: Complete replaces the claim held by
// the token with the response (SET ... PX ttl), keeping the first request's
// fingerprint; Renew extends the claim held by the token (PEXPIRE); Release
// deletes it. Expiry is
// Redis's own, so nothing needs pruning and the servers' clocks need not
// agree. Keys are single, so Redis Cluster and Ring shard them freely.
//
// # The primary only
//
// Claims and the reads that follow them must go to the primary, never to a
// replica. Replication is asynchronous: a replica that lags by a few
// milliseconds does not yet have a claim or a response the primary has
// accepted, so a client's fast retry that read from it would find the key
// free and run the effect a second time. The Store never sends a read-only
// command (Claim's GET is part of its SET, and the scripts run with EVALSHA,
// not EVALSHA_RO), so go-redis routes every call to the primary even with
// ReadOnly or RouteByLatency set on a ClusterClient; do not give it a
// client connected to a replica.
//
// # Eviction
//
// The server must run with maxmemory-policy noeviction. Every record the
// store writes carries a TTL, so under memory pressure every other policy
// may evict one: the allkeys-* policies any key, the volatile-* policies any
// key with a TTL (volatile-ttl the soonest to expire, in-progress claims
// first). An evicted claim or response lets its key run a second time.
// Under noeviction a full Redis refuses writes instead, and nothing runs
// twice: a claim of a free key fails with [idemserver.ErrStoreFull] (the
// middleware answers 503), while a retry of a claimed or completed key
// still gets 409 or its replay (the Store reads the key when Redis
// refuses the claim's SET). A claim that fitted may be followed by a
// Complete Redis refuses, the memory having filled while the handler ran:
// the middleware tries it again while the claim's lock is live, and
// first pins the claim for the TTL (Renew, a PEXPIRE, which Redis runs
// even past maxmemory), so that a Complete that never gets through leaves
// the key claimed, answering 409 for the TTL, never free to run again
// (TestNoEvictionNearMaxMemory). Its response reached its caller, but is
// not replayed.
//
// The Store asks for the policy (CONFIG GET maxmemory-policy, on every
// primary of a Cluster or shard of a Ring) before its first claim, and
// refuses claims with an [*EvictionPolicyError] until the answer is
// noeviction; [Store.CheckEvictionPolicy] makes the same check at start.
// A server that refuses CONFIG GET cannot be checked and is refused too.
// [Options].AllowEviction skips the check, for those who accept the risk
// or know the policy by other means. The policy is checked once: a later
// CONFIG SET goes unseen.
//
// # Durability
//
// Records are as durable as the Redis that holds them. A Redis that
// restarts empty (no persistence) forgets every claim and response: the
// retries of those keys run their effects again. Run the store's Redis
// with appendonly yes (appendfsync always loses nothing; everysec, up to
// a second), and remember that a failover to a replica may lose the writes
// it had not yet received.
//
// While Redis is unreachable, Claim fails and the middleware answers 503
// with Retry-After. A response whose Complete fails is still sent to its
// caller; the Complete is tried again while the claim's lock is live, and
// the claim is pinned for the TTL should Redis answer the pin: if no
// Complete gets through, the key answers 409 for the TTL (pinned) or
// until its lock times out (Redis unreachable throughout), after which a
// retry runs again: an outage longer than the lock timeout, right after
// a handler, is the one case in which a key of this store runs twice.
// A claim whose handler is running survives an outage, a restart
// included, shorter than 0.85 of the lock timeout: the middleware renews
// it every tenth of the lock timeout and promptly after a failed renewal
// (TestClaimSurvivesRestart).
// go-redis resends a command whose connection failed (its MaxRetries): a
// resent Claim recognises its own earlier claim; a resent Complete whose
// first run succeeded reports [idemserver.ErrClaimLost], though the
// response is stored (the middleware then leaves the key as it is).
//
// # Shutdown, hung handlers, upgrades
//
// The Store holds no state of its own: a server that shuts down (or
// crashes) leaves its claims in Redis, where they expire with their lock
// timeout, and its records, kept for their TTL. A handler that hangs
// keeps its claim for as long as it runs, renewed by the middleware.
//
// The values are a persisted format, version 1: a claim is "C", the
// token's length in decimal, ":", the token and the fingerprint; a
// completed record is "R", the fingerprint's length, ":", the fingerprint
// and the record (idemserver's record format, itself versioned by its
// first byte). A value of another form is refused as corrupt (503), never
// taken for a free key. A new format takes a new leading letter, read by
// one release before another writes it, so that instances of two releases
// side by side agree on every key; records written by the release before
// this one are read as they are (testdata/baseline, TestBaselineRecords).
package redis
