package postgres_test

import (
	"context"
	"fmt"
	"github.com/idemkit/idemhttp/internal/storeharness"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// terminate ends every server session of the schema's pools, as a
// restart of the server (or a failover) does, and returns how many it
// ended.
func (s *testSchema) terminate(t *testing.T) int {
	t.Helper()
	var n int
	err := s.admin(t).QueryRow(context.Background(), `
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE application_name = $1 AND pid <> pg_backend_pid()`, s.name).Scan(&n)
	require.NoError(t, err)
	return n
}

// TestServerSessionsTerminated ends the store's sessions under the
// middleware, while handlers run and between requests: the store resends
// statements that never ran on fresh connections, so every response is
// stored once and replayed to its own caller.
func TestServerSessionsTerminated(t *testing.T) {
	s := newSchema(t)
	store := newStore(t, s.pool(t, 4))
	e := storeharness.NewEffects()
	var log storeharness.SyncBuffer
	srv := storeharness.Serve(t, store, e, time.Minute, &log)

	const n = 10
	started, release := e.Hold(n)
	replies := make(chan storeharness.Reply, n)
	for i := range n {
		go func() { replies <- storeharness.Post(srv, "a", fmt.Sprint("key-", i), fmt.Sprint("op-", i)) }()
	}
	for range n {
		<-started
	}
	require.Positive(t, s.terminate(t))
	release()
	for range n {
		got := <-replies
		require.NoError(t, got.Err)
		assert.Equal(t, http.StatusCreated, got.Status)
		assert.False(t, got.Replayed)
	}

	require.Positive(t, s.terminate(t))
	for i := range n {
		got := storeharness.Post(srv, "a", fmt.Sprint("key-", i), fmt.Sprint("op-", i))
		assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Replayed: true, Body: storeharness.Created(fmt.Sprint("op-", i), 1)}, got)
		got = storeharness.Post(srv, "b", fmt.Sprint("key-", i), fmt.Sprint("op-b-", i))
		assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Body: storeharness.Created(fmt.Sprint("op-b-", i), 1)}, got)
	}
	for i := range n {
		assert.Equal(t, 1, e.Count(fmt.Sprint("op-", i)), "op-%d", i)
	}
	assert.Empty(t, log.String(), "no store error reached the middleware")
}

// TestServerDown puts the store behind a proxy and cuts it: requests get
// a clear 503 while the server is unreachable, and a response that could
// not be stored leaves its key claimed until the lock timeout, no longer.
func TestServerDown(t *testing.T) {
	const lockTimeout = 2 * time.Second
	s := newSchema(t)
	p := newProxy(t, s.url)
	store := newStore(t, p.pool(t, s))
	e := storeharness.NewEffects()
	var log storeharness.SyncBuffer
	srv := storeharness.Serve(t, store, e, lockTimeout, &log)

	require.Equal(t, http.StatusCreated, storeharness.Post(srv, "a", "key-before", "op-before").Status)

	p.cut()
	got := storeharness.Post(srv, "a", "key-down", "op-down")
	assert.Equal(t, storeharness.Reply{Status: http.StatusServiceUnavailable, Body: idemserver.TypeStoreUnavailable}, got)
	assert.Zero(t, e.Count("op-down"))
	assert.Contains(t, log.String(), "idemhttp/postgres: claim")

	p.restore()
	got = storeharness.Post(srv, "a", "key-before", "op-before")
	assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Replayed: true, Body: storeharness.Created("op-before", 1)}, got)

	// The server becomes unreachable while a handler runs: its caller
	// gets the response, which is not stored, and the key is free again
	// after the lock timeout. (The retry then runs the operation a second
	// time: the middleware's documented cost of an unstored response.)
	started, release := e.Hold(1)
	inflight := make(chan storeharness.Reply, 1)
	go func() { inflight <- storeharness.Post(srv, "a", "key-stuck", "op-stuck") }()
	<-started
	claimedAt := time.Now()
	p.cut()
	release()
	assert.Equal(t, storeharness.Reply{Status: http.StatusCreated, Body: storeharness.Created("op-stuck", 1)}, <-inflight)
	assert.Contains(t, log.String(), "response not stored")
	p.restore()
	// Checked only when the claim is surely live: a loaded machine may
	// take longer than the lock timeout to get here.
	if time.Since(claimedAt) < lockTimeout/2 {
		got = storeharness.Post(srv, "a", "key-stuck", "op-stuck")
		assert.Equal(t, storeharness.Reply{Status: http.StatusConflict, Body: idemserver.TypeInProgress}, got)
	}
	require.Eventually(t, func() bool {
		return storeharness.Post(srv, "a", "key-stuck", "op-stuck").Status == http.StatusCreated
	}, 10*lockTimeout, 50*time.Millisecond, "the key must be free after the lock timeout")
	assert.Equal(t, 2, e.Count("op-stuck"))
}

// proxy forwards TCP connections to the test server until cut, which
// closes every connection and refuses new ones, as an unreachable server
// would; restore listens again on the same address.
type proxy struct {
	t        *testing.T
	upstream string
	addr     string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newProxy(t *testing.T, serverURL string) *proxy {
	u, err := url.Parse(serverURL)
	require.NoError(t, err)
	p := &proxy{t: t, upstream: u.Host, conns: make(map[net.Conn]struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() {
		p.cut()
		p.wg.Wait()
	})
	return p
}

// pool returns a pool on s's schema through the proxy.
func (p *proxy) pool(t *testing.T, s *testSchema) *pgxpool.Pool {
	u, err := url.Parse(s.url)
	require.NoError(t, err)
	u.Host = p.addr
	q := u.Query()
	q.Set("connect_timeout", "1")
	u.RawQuery = q.Encode()
	return (&testSchema{url: u.String(), name: s.name}).pool(t, 4)
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !p.track(c, up) {
				continue
			}
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				p.wg.Go(func() {
					_, _ = io.Copy(pair[0], pair[1])
					_ = pair[0].Close()
					_ = pair[1].Close()
				})
			}
		}
	})
}

// track records a connection pair, or closes it if the proxy was cut
// meanwhile.
func (p *proxy) track(c, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		_ = c.Close()
		_ = up.Close()
		return false
	}
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	return true
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *proxy) restore() {
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(p.t, err, "listen again on %s", p.addr)
	p.serve(ln)
}
