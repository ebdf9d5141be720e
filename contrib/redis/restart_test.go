package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"github.com/idemkit/idemhttp/internal/storeharness"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/needs"
)

// privateRedis is a redis-server of the test's own, on a unix socket in
// a temporary directory, so that the test can crash and restart it
// without disturbing the shared server other tests use. It keeps an
// append-only file synced on every write, as a store that must survive
// restarts should.
type privateRedis struct {
	t    *testing.T
	dir  string
	sock string
	cmd  *exec.Cmd
	out  bytes.Buffer
	args []string // more redis-server arguments
}

func startPrivateRedis(t *testing.T, args ...string) *privateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		needs.Missing(t, "redis-server is not installed", needs.Services)
	}
	// A short directory: unix socket paths are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "idemredis")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	r := &privateRedis{t: t, dir: dir, sock: filepath.Join(dir, "redis.sock"), args: args}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *privateRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", append([]string{
		"--port", "0", "--unixsocket", r.sock, "--unixsocketperm", "700",
		"--dir", r.dir, "--save", "", "--appendonly", "yes", "--appendfsync", "always"}, r.args...)...)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	require.NoError(r.t, r.cmd.Start())
	c := goredis.NewClient(&goredis.Options{Network: "unix", Addr: r.sock, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		require.True(r.t, time.Now().Before(deadline), "redis-server did not start:\n%s", r.out.String())
		time.Sleep(5 * time.Millisecond) // polling for readiness, not ordering
	}
}

// kill crashes the server (SIGKILL) and waits for it to exit.
func (r *privateRedis) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

func (r *privateRedis) client(t *testing.T) *goredis.Client {
	// One dial attempt per command instead of five: while the server is
	// down, a request should fail in milliseconds, not seconds.
	c := goredis.NewClient(&goredis.Options{Network: "unix", Addr: r.sock, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestServerRestart crashes and restarts Redis under the middleware: in
// flight, between requests, and for longer than the lock timeout. Requests
// fail with a clear 503 while it is down, responses go to their own
// callers, and no key stays claimed past the lock timeout.
func TestServerRestart(t *testing.T) {
	const lockTimeout = 2 * time.Second
	r := startPrivateRedis(t)
	store := idemredis.NewStore(r.client(t), nil)
	e := storeharness.NewEffects()
	var log storeharness.SyncBuffer
	srv := storeharness.Serve(t, store, e, lockTimeout, &log)

	// Ten requests claim their keys; the server crashes and comes back
	// while their handlers run; their responses are then stored.
	const n = 10
	started, release := e.Hold(n)
	replies := make(chan storeharness.Reply, n)
	for i := range n {
		go func() { replies <- storeharness.Post(srv, "a", fmt.Sprint("key-", i), fmt.Sprint("op-", i)) }()
	}
	for range n {
		<-started
	}
	r.kill()
	r.start()
	release()
	for range n {
		got := <-replies
		require.NoError(t, got.Err)
		assert.Equal(t, http.StatusCreated, got.Status)
		assert.False(t, got.Replayed)
	}
	require.NotContains(t, log.String(), "not stored", "the claims survived the restart, so every response is stored")

	// After another crash and restart, every key replays its own
	// response; another tenant's same keys run their own operations.
	r.kill()
	r.start()
	for i := range n {
		got := storeharness.Post(srv, "a", fmt.Sprint("key-", i), fmt.Sprint("op-", i))
		assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Replayed: true, Body: storeharness.Created(fmt.Sprint("op-", i), 1)}, got)
		got = storeharness.Post(srv, "b", fmt.Sprint("key-", i), fmt.Sprint("op-b-", i))
		assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Body: storeharness.Created(fmt.Sprint("op-b-", i), 1)}, got)
	}

	// While the server is down, requests get a 503 problem and nothing
	// runs.
	r.kill()
	got := storeharness.Post(srv, "a", "key-down", "op-down")
	assert.Equal(t, storeharness.Reply{Status: http.StatusServiceUnavailable, Body: idemserver.TypeStoreUnavailable}, got)
	assert.Zero(t, e.Count("op-down"))
	assert.Contains(t, log.String(), "idemhttp/redis: claim")

	// A request whose handler finishes while the server is down cannot
	// store its response: the caller still gets it, and the key is
	// claimed until the lock timeout, then free again. (The retry then
	// runs the operation a second time: the middleware's documented cost
	// of an unstored response.)
	r.start()
	started, release = e.Hold(1)
	inflight := make(chan storeharness.Reply, 1)
	go func() { inflight <- storeharness.Post(srv, "a", "key-stuck", "op-stuck") }()
	<-started
	claimedAt := time.Now()
	r.kill()
	release()
	got = <-inflight
	assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Body: storeharness.Created("op-stuck", 1)}, got)
	assert.Contains(t, log.String(), "response not stored")
	r.start()
	// Checked only when the claim is surely live: a loaded machine may
	// take longer than the lock timeout to get here.
	if time.Since(claimedAt) < lockTimeout/2 {
		got = storeharness.Post(srv, "a", "key-stuck", "op-stuck")
		assert.Equal(t, storeharness.Reply{Status: http.StatusConflict, Body: idemserver.TypeInProgress}, got, "the claim survived the crash")
	}
	require.Eventually(t, func() bool {
		return storeharness.Post(srv, "a", "key-stuck", "op-stuck").Status == http.StatusCreated
	}, 10*lockTimeout, 50*time.Millisecond, "the key must be free after the lock timeout")
	assert.Equal(t, 2, e.Count("op-stuck"))

	for i := range n {
		assert.Equal(t, 1, e.Count(fmt.Sprint("op-", i)), "op-%d", i)
	}
}

// TestClaimSurvivesRestart kills Redis while a handler runs and restarts
// it after 0.45 of the lock timeout (the outage that lost claims when
// renewals ran at 1/3 and 2/3 of it and a failed one waited for the next):
// renewals resume once it is back, so once the lock timeout has passed
// since the outage began, a retry still gets 409 rather than a second run,
// and the slow response is stored. Checked to fail with the renewer's old
// schedule (every LockTimeout/3, no prompt retry): the retry ran the
// operation a second time.
func TestClaimSurvivesRestart(t *testing.T) {
	const lockTimeout = 3 * time.Second
	r := startPrivateRedis(t)
	store := idemredis.NewStore(r.client(t), nil)
	e := storeharness.NewEffects()
	var log storeharness.SyncBuffer
	srv := storeharness.Serve(t, store, e, lockTimeout, &log)

	started, release := e.Hold(1)
	first := make(chan storeharness.Reply, 1)
	go func() { first <- storeharness.Post(srv, "a", "key-slow", "op-slow") }()
	<-started
	// Real time must pass for renewals to fail and a lock to time out:
	// these waits order nothing.
	<-time.After(lockTimeout / 4) // so that the outage covers 1/3 and 2/3
	down := time.Now()
	r.kill()
	<-time.After(lockTimeout * 45 / 100)
	r.start()
	<-time.After(time.Until(down.Add(lockTimeout + lockTimeout/10)))
	retry := storeharness.Post(srv, "a", "key-slow", "op-slow")
	release()
	assert.Equal(t, storeharness.Reply{Status: http.StatusConflict, Body: idemserver.TypeInProgress}, retry, "the claim survived the outage")
	got := <-first
	assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Body: storeharness.Created("op-slow", 1)}, got)
	assert.Contains(t, log.String(), "renewing the claim failed", "the outage was seen")
	assert.NotContains(t, log.String(), "response not stored")
	assert.Equal(t, 1, e.Count("op-slow"))
	replay := storeharness.Post(srv, "a", "key-slow", "op-slow")
	assert.True(t, replay.Replayed)
}
