package postgres_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// goldenRow is what the golden dump holds of one entry, as the previous
// release wrote it (testdata/README.md says how).
type goldenRow struct {
	op       string
	state    idemhttp.State
	status   int
	attempts int
}

// goldenRows are the dump's entries by key, and, for keys the previous
// release minted, by operation: testdata/journal-2d053bb.sql.
var goldenRows = []goldenRow{
	{op: "op-done-201", state: idemhttp.StateDone, status: 201, attempts: 1},
	{op: "op-done-402", state: idemhttp.StateDone, status: 402, attempts: 1},
	{op: "op-done-stored-500", state: idemhttp.StateDone, status: 500, attempts: 1},
	{op: "op-pending-503", state: idemhttp.StatePending, status: 503, attempts: 2},
	{op: "", state: idemhttp.StateDone, status: 201, attempts: 1},
	{op: "op-pending-killed", state: idemhttp.StatePending},
	{op: "op-enqueued", state: idemhttp.StatePending},
	{op: "op-enqueued-empty", state: idemhttp.StatePending},
	{op: "", state: idemhttp.StatePending},
	{op: "op-abandoned", state: idemhttp.StateAbandoned, status: 503, attempts: 4},
}

// loadGolden creates a schema holding the idemhttp_journal table the
// previous release (commit 2d053bb) wrote, as its dump has it, before any
// Migrate of this release, and returns it with the dump's latest time.
func loadGolden(t *testing.T) (*testSchema, time.Time) {
	t.Helper()
	ctx := context.Background()
	dump, err := os.ReadFile("testdata/journal-2d053bb.sql")
	require.NoError(t, err)
	s := &testSchema{url: serverURL(t), name: "idemtest_" + randomHex(6)}
	admin := s.admin(t)
	_, err = admin.Exec(ctx, "CREATE SCHEMA "+s.name)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := s.admin(t).Exec(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
		require.NoError(t, err)
	})
	// The dump sets its session's search_path to nothing: a connection of
	// its own, closed after.
	load := s.admin(t)
	_, err = load.Exec(ctx, strings.ReplaceAll(string(dump), "idemhttp_golden.", s.name+"."))
	require.NoError(t, err)
	require.NoError(t, load.Close(ctx))
	var latest time.Time
	require.NoError(t, admin.QueryRow(ctx, "SELECT max(greatest(created_at, updated_at, lease_expires_at)) FROM "+s.name+".idemhttp_journal").Scan(&latest))
	return s, latest
}

// goldenServer answers every request 201, whatever its host, and records
// the key and body of each.
type goldenServer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	sent map[string]string // key -> body
}

func newGoldenServer(t *testing.T) *goldenServer {
	g := &goldenServer{sent: make(map[string]string)}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		g.sent[r.Header.Get("Idempotency-Key")] = string(body)
		g.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_after_upgrade"}`)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

// client returns a Client on j whose requests all reach g, as the dump's
// URLs (http://api.golden.example) are sent.
func (g *goldenServer) client(j idemhttp.Journal) *idemhttp.Client {
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, g.srv.Listener.Addr().String())
	}
	return &idemhttp.Client{
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}},
		Journal:    j,
		Policy:     &idemhttp.Policy{MaxAttempts: 1, KeepResults: 1 << 10},
	}
}

func (g *goldenServer) sentBodies() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]string, len(g.sent))
	for k, v := range g.sent {
		out[k] = v
	}
	return out
}

// TestJournalBaselineGolden: a journal table the previous release wrote
// (commit 2d053bb: entries pending, leased by a worker that died, enqueued
// and never leased, done with 201, 402 and a replayed 500, abandoned, and
// one deleted) is upgraded in place by Migrate, and the new code reads
// every entry as it was, resends the pending ones with their own keys and
// bodies, and sends nothing for the done and abandoned ones. Checked to
// fail with Migrate's ALTER TABLE ... ADD COLUMN result removed (every
// read of an old table fails), and with entryColumns reading a column the
// old table lacks and Migrate does not add, and with Migrate's ADD COLUMN
// doubt removed (ClockDoubt fails on the old table).
func TestJournalBaselineGolden(t *testing.T) {
	ctx := context.Background()
	s, latest := loadGolden(t)
	pool := s.pool(t, 0)
	require.NoError(t, postgres.Migrate(ctx, pool))
	require.NoError(t, postgres.Migrate(ctx, pool), "a second Migrate changes nothing")

	// Ten minutes after the dump: every lease it holds has expired, and
	// every entry is well within a day's retention.
	now := latest.Add(10 * time.Minute)
	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "new", Clock: func() time.Time { return now }})
	mark, err := j.HighWater(ctx)
	require.NoError(t, err)
	assert.False(t, mark.IsZero(), "Migrate starts the high-water mark from the old table's times")
	assert.False(t, mark.After(latest), "mark %v, latest %v", mark, latest)
	doubt, err := j.ClockDoubt(ctx)
	require.NoError(t, err, "the clock table has its doubt column after Migrate")
	assert.True(t, doubt.IsZero(), "an old table holds no doubt: %v", doubt)

	// Every entry reads back as the previous release wrote it.
	var keys []string
	rows, err := pool.Query(ctx, "SELECT key FROM idemhttp_journal ORDER BY created_at")
	require.NoError(t, err)
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			break
		}
		keys = append(keys, key)
	}
	rows.Close()
	require.NoError(t, rows.Err())
	var all []*idemhttp.Entry
	for _, key := range keys {
		e, err := j.Get(ctx, key)
		require.NoError(t, err)
		all = append(all, e)
	}
	require.Len(t, all, len(goldenRows), "the deleted entry stays gone")
	byOp := map[string]*idemhttp.Entry{}
	for _, e := range all {
		if e.Operation != "" {
			byOp[e.Operation] = e
		}
		assert.Nil(t, e.Result, "the previous release kept no results")
		assert.True(t, e.NotBefore.IsZero(), "nor parked any entry")
		assert.NotContains(t, e.Header, "X-Api-Key", "its SecretHeaders withheld it")
		fresh, err := (&idemhttp.Entry{Key: e.Key, Method: e.Method, URL: e.URL, Body: e.Body}).Sanitized()
		require.NoError(t, err)
		assert.Equal(t, fresh.Fingerprint, e.Fingerprint, "%s: the fingerprint rule is the same", e.Key)
	}
	for _, want := range goldenRows {
		if want.op == "" {
			continue
		}
		e := byOp[want.op]
		require.NotNil(t, e, want.op)
		assert.Equal(t, want.state, e.State, want.op)
		assert.Equal(t, want.status, e.LastStatus, want.op)
		assert.Equal(t, want.attempts, e.Attempts, want.op)
	}
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "Stripe-Version": {"2024-06-20"}, "X-Multi": {"one", "two"}}, byOp["op-done-201"].Header)
	assert.Equal(t, []byte{}, byOp["op-enqueued-empty"].Body, "an empty body stays empty, not absent")

	// The pending entries are claimed (every lease expired) and resent
	// with their own keys and bodies; the server's answers are kept.
	g := newGoldenServer(t)
	c := g.client(j)
	claimed, err := j.ClaimPending(ctx, 100)
	require.NoError(t, err)
	wantSent := map[string]string{}
	for _, e := range all {
		if e.State == idemhttp.StatePending {
			wantSent[e.Key] = string(e.Body)
		}
	}
	require.Len(t, claimed, len(wantSent))
	results, err := c.Resume(ctx, &idemhttp.ResumeOptions{Entries: claimed})
	require.NoError(t, err)
	for _, r := range results {
		assert.NoError(t, r.Err, r.Entry.Key)
		assert.Equal(t, http.StatusCreated, r.StatusCode, r.Entry.Key)
	}
	assert.Equal(t, wantSent, g.sentBodies(), "each pending entry resent once, under its own key, with its own body")
	for key := range wantSent {
		e, err := j.Get(ctx, key)
		require.NoError(t, err)
		assert.Equal(t, idemhttp.StateDone, e.State, key)
		if assert.NotNil(t, e.Result, "an old row keeps a result now: %s", key) {
			assert.Equal(t, `{"id":"ch_after_upgrade"}`, string(e.Result.Body))
		}
	}

	// A rerun of a done or abandoned operation sends nothing.
	rerun := func(op string) error {
		e := byOp[op]
		req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, op), e.Method, e.URL, strings.NewReader(string(e.Body)))
		require.NoError(t, err)
		resp, err := c.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	for _, op := range []string{"op-done-201", "op-done-402", "op-done-stored-500"} {
		var done *idemhttp.DoneError
		if assert.ErrorAs(t, rerun(op), &done, op) {
			assert.Equal(t, byOp[op].Key, done.Key, op)
		}
	}
	assert.ErrorIs(t, rerun("op-abandoned"), idemhttp.ErrKeyExpired)
	assert.Len(t, g.sentBodies(), len(wantSent), "nothing more was sent")
}
