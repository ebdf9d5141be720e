package postgres_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// parkClock is a clock shared by a fleet's journals, moved by the test.
type parkClock struct{ ns atomic.Int64 }

func (c *parkClock) now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *parkClock) set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *parkClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestJournalParked: issue 34 §4 on a fleet's journal. A worker's call
// that the server asks to come back in an hour parks the operation: the
// row keeps the server's time (not_before), no worker claims it before
// then, even with its lease long expired, and a worker claims and sends
// it once from then on, under its key; a rerun refused before the time
// takes no lease; done clears the time. Checked to fail with
// claimPendingSQL's not_before condition removed (worker b claimed the
// parked entry at once), with finishSQL leaving not_before unset (the
// entry was not parked), and with takeSQL's not_before condition removed
// (b's refused rerun leased the entry).
func TestJournalParked(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	clock := &parkClock{}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock.set(t0)
	a := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{Worker: "a", Lease: time.Minute, Clock: clock.now})
	b := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{Worker: "b", Lease: time.Minute, Clock: clock.now})

	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	sent := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), keys...)
	}
	policy := &idemhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}

	req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, "export-1"), http.MethodPost, srv.URL+"/v1/exports", strings.NewReader(`{"n":1}`))
	require.NoError(t, err)
	_, err = (&idemhttp.Client{Journal: a, Policy: policy}).Do(req)
	var parked *idemhttp.ParkedError
	require.ErrorAs(t, err, &parked)
	assert.Equal(t, t0.Add(time.Hour), parked.NotBefore, "the server's time by the fleet's clock")
	e, err := a.Lookup(ctx, "export-1")
	require.NoError(t, err)
	assert.True(t, t0.Add(time.Hour).Equal(e.NotBefore), "kept in the row: %v", e.NotBefore)
	assert.Equal(t, idemhttp.StatePending, e.State)

	clock.advance(10 * time.Minute) // a's lease is long gone
	got, err := b.ClaimPending(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, got, "no worker claims a parked entry before its time")

	// A rerun of the operation on worker b before the time is refused,
	// and takes no lease: at the time, any worker claims it at once.
	req, err = http.NewRequestWithContext(idemhttp.WithOperation(ctx, "export-1"), http.MethodPost, srv.URL+"/v1/exports", strings.NewReader(`{"n":1}`))
	require.NoError(t, err)
	_, err = (&idemhttp.Client{Journal: b, Policy: policy}).Do(req)
	require.ErrorIs(t, err, idemhttp.ErrParked)
	var owner *string
	require.NoError(t, s.admin(t).QueryRow(ctx, "SELECT lease_owner FROM "+s.name+".idemhttp_journal WHERE key = $1", e.Key).Scan(&owner))
	if assert.NotNil(t, owner) {
		assert.Equal(t, "a", *owner, "still a's expired lease, not b's")
	}

	clock.set(t0.Add(time.Hour))
	got, err = b.ClaimPending(ctx, 10)
	require.NoError(t, err)
	require.Len(t, got, 1, "claimed at its time")
	rs, err := (&idemhttp.Client{Journal: b, Policy: policy}).Resume(ctx, &idemhttp.ResumeOptions{Entries: got})
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.NoError(t, rs[0].Err)
	assert.Equal(t, http.StatusCreated, rs[0].StatusCode)
	k := sent()
	require.Len(t, k, 2)
	assert.Equal(t, k[0], k[1], "under its key")
	e, err = b.Get(ctx, e.Key)
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, e.State)
	assert.True(t, e.NotBefore.IsZero(), "done: not parked")
}
