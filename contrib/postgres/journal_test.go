package postgres_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// entry returns a pending entry for key, created i seconds after base.
func entry(key string, i int) *idemhttp.Entry {
	url := "https://api.example.com/v1/charges"
	body := []byte(`{"key":"` + key + `"}`)
	return &idemhttp.Entry{
		Operation: "op-" + key,
		Key:       key,
		Method:    http.MethodPost,
		URL:       url,
		Header:    http.Header{"Content-Type": {"application/json"}},
		Body:      body,
		Created:   base.Add(time.Duration(i) * time.Second),
		State:     idemhttp.StatePending,
	}
}

func keysOf(es []*idemhttp.Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Key)
	}
	return out
}

// lease is the lease row of key.
type lease struct {
	Owner   *string
	Expires *time.Time
}

func leaseOf(t *testing.T, s *testSchema, key string) lease {
	t.Helper()
	var l lease
	err := s.admin(t).QueryRow(context.Background(),
		"SELECT lease_owner, lease_expires_at FROM "+s.name+".idemhttp_journal WHERE key = $1", key).
		Scan(&l.Owner, &l.Expires)
	require.NoError(t, err)
	return l
}

func enqueue(t *testing.T, j *postgres.Journal, keys ...string) {
	t.Helper()
	for i, k := range keys {
		existing, err := j.Enqueue(context.Background(), entry(k, i))
		require.NoError(t, err)
		require.Nil(t, existing)
	}
}

func claim(t *testing.T, j *postgres.Journal, limit int) []string {
	t.Helper()
	es, err := j.ClaimPending(context.Background(), limit)
	require.NoError(t, err)
	return keysOf(es)
}

func TestClaimPendingLeasesOldestFirst(t *testing.T) {
	s := newSchema(t)
	pool := s.pool(t, 0)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "a", Lease: time.Hour})
	b := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "b", Lease: time.Hour})
	enqueue(t, a, "k0", "k1", "k2", "k3", "k4")

	assert.Equal(t, []string{"k0", "k1", "k2"}, claim(t, a, 3))
	assert.Equal(t, []string{"k3", "k4"}, claim(t, b, 10))
	assert.Empty(t, claim(t, a, 10), "every entry is leased")
	assert.Empty(t, claim(t, b, 10), "every entry is leased")
	l := leaseOf(t, s, "k1")
	require.NotNil(t, l.Owner)
	assert.Equal(t, "a", *l.Owner)

	pending, err := a.Pending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, []string{"k0", "k1", "k2", "k3", "k4"}, keysOf(pending), "Pending lists leased entries too")
}

func TestClaimPendingTakesExpiredLeases(t *testing.T) {
	s := newSchema(t)
	pool := s.pool(t, 0)
	// A lease of a microsecond has expired by the next statement: the
	// worker that took it is as good as dead.
	dead := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "dead", Lease: time.Microsecond})
	live := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "live", Lease: time.Hour})
	enqueue(t, dead, "k0", "k1")
	assert.Equal(t, []string{"k0", "k1"}, claim(t, dead, 10))
	assert.Equal(t, []string{"k0", "k1"}, claim(t, live, 10), "expired leases are taken over")
	assert.Empty(t, claim(t, dead, 10), "the new leases hold")
}

func TestBeginLeasesToItsWorker(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "a", Lease: time.Hour})
	b := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "b", Lease: time.Hour})
	_, err := a.Begin(ctx, entry("began", 0))
	require.NoError(t, err)
	_, err = a.Enqueue(ctx, entry("queued", 1))
	require.NoError(t, err)

	assert.Equal(t, []string{"queued"}, claim(t, b, 10), "an entry being sent by its worker is not claimed")
	l := leaseOf(t, s, "began")
	require.NotNil(t, l.Owner)
	assert.Equal(t, "a", *l.Owner)
	require.NotNil(t, l.Expires)
	assert.WithinDuration(t, time.Now().Add(time.Hour), *l.Expires, time.Minute)
}

func TestFinishAndLeases(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		give       []idemhttp.State // outcomes recorded in order, after a claim
		wantState  idemhttp.State
		wantStatus int
		wantLeased bool
	}{
		{name: "done ends the lease", give: []idemhttp.State{idemhttp.StateDone}, wantState: idemhttp.StateDone, wantStatus: 200},
		{name: "abandoned ends the lease", give: []idemhttp.State{idemhttp.StateAbandoned}, wantState: idemhttp.StateAbandoned, wantStatus: 200},
		{name: "pending keeps the lease", give: []idemhttp.State{idemhttp.StatePending}, wantState: idemhttp.StatePending, wantStatus: 200, wantLeased: true},
		{name: "done stays done", give: []idemhttp.State{idemhttp.StateDone, idemhttp.StatePending}, wantState: idemhttp.StateDone, wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSchema(t)
			j := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{Worker: "w", Lease: time.Hour})
			enqueue(t, j, "k")
			require.Equal(t, []string{"k"}, claim(t, j, 1))
			status := 200
			for _, st := range tt.give {
				require.NoError(t, j.Finish(ctx, "k", idemhttp.Outcome{State: st, Status: status, Attempts: 1, At: base.Add(time.Minute)}))
				status = 504 // a later, stale outcome's status
			}
			got, err := j.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, tt.wantState, got.State)
			assert.Equal(t, tt.wantStatus, got.LastStatus)
			assert.Equal(t, len(tt.give), got.Attempts, "every call's attempts count")
			assert.Equal(t, tt.wantLeased, leaseOf(t, s, "k").Owner != nil)
		})
	}
}

// TestClaimPendingConcurrent has eight workers claim from one queue at
// once: SKIP LOCKED hands each entry to exactly one.
func TestClaimPendingConcurrent(t *testing.T) {
	s := newSchema(t)
	pool := s.pool(t, 8)
	const n = 200
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
	}
	enqueue(t, postgres.NewJournal(pool, nil), keys...)

	var (
		mu   sync.Mutex
		got  []string
		errs []error
		wg   sync.WaitGroup
	)
	for w := range 8 {
		j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: fmt.Sprint("w", w), Lease: time.Hour})
		wg.Go(func() {
			for {
				es, err := j.ClaimPending(context.Background(), 7)
				mu.Lock()
				got = append(got, keysOf(es)...)
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil || len(es) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	require.Empty(t, errs)
	slices.Sort(got)
	assert.Equal(t, keys, got, "each entry claimed once")
}

func TestJournalRefuses(t *testing.T) {
	ctx := context.Background()
	j := postgres.NewJournal(newSchema(t).pool(t, 0), nil)
	withHeader := func(name, value string) *idemhttp.Entry {
		e := entry("k", 0)
		e.Header = http.Header{name: {value}}
		return e
	}
	tests := []struct {
		name string
		give func() error
		want error
	}{
		{"invalid key", func() error { _, err := j.Begin(ctx, entry("bad key\n", 0)); return err }, idemhttp.ErrInvalidKey},
		{"invalid operation", func() error {
			e := entry("k", 0)
			e.Operation = "op\x00"
			_, err := j.Begin(ctx, e)
			return err
		}, idemhttp.ErrInvalidRequest},
		{"nil entry", func() error { _, err := j.Begin(ctx, nil); return err }, idemhttp.ErrInvalidRequest},
		{"header not UTF-8", func() error { _, err := j.Begin(ctx, withHeader("X-Name", "caf\xe9")); return err }, idemhttp.ErrInvalidRequest},
		{"header with NUL", func() error { _, err := j.Begin(ctx, withHeader("X-Name", "a\x00b")); return err }, idemhttp.ErrInvalidRequest},
		{"URL that does not parse", func() error {
			e := entry("k", 0)
			e.URL = "http://[::1"
			_, err := j.Begin(ctx, e)
			return err
		}, idemhttp.ErrInvalidRequest},
		{"negative attempts", func() error {
			e := entry("k", 0)
			e.Attempts = -1
			_, err := j.Begin(ctx, e)
			return err
		}, idemhttp.ErrInvalidRequest},
		{"unknown state", func() error {
			return j.Finish(ctx, "k", idemhttp.Outcome{State: "lost"})
		}, idemhttp.ErrInvalidRequest},
		{"zero limit", func() error { _, err := j.ClaimPending(ctx, 0); return err }, idemhttp.ErrInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.ErrorIs(t, tt.give(), tt.want)
		})
	}
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, pending, "nothing refused was stored")
}

func TestJournalOptions(t *testing.T) {
	ctx := context.Background()
	j := postgres.NewJournal(newSchema(t).pool(t, 0), &postgres.JournalOptions{OmitBodies: true})
	e := entry("k", 0)
	e.URL = "https://user:hunter2@api.example.com/v1/charges"
	_, err := j.Begin(ctx, e)
	require.ErrorIs(t, err, idemhttp.ErrInvalidRequest, "credentials in the URL are refused")
	e.URL = "https://api.example.com/v1/charges#frag"
	e.Header.Set("Authorization", "Bearer secret")
	_, err = j.Begin(ctx, e)
	require.NoError(t, err)

	got, err := j.Get(ctx, "k")
	require.NoError(t, err)
	assert.Nil(t, got.Body)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, got.Header)
	assert.Equal(t, "https://api.example.com/v1/charges", got.URL)
	want, err := e.Sanitized()
	require.NoError(t, err)
	assert.Equal(t, want.Fingerprint, got.Fingerprint, "filled in from the request")

	host := postgres.NewJournal(nil, nil).Worker()
	assert.Regexp(t, `:\d+$`, host, "the default worker name is hostname:pid")
}

// TestJournalFencing: a worker whose lease expired and was claimed again
// cannot finish or renew the entry, and learns why; even two workers of
// one name are told apart. Checked to fail with the fence (leasedToOther)
// removed from Finish: the stale worker's outcome then overwrote the
// entry the new holder was sending.
func TestJournalFencing(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	stale := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "w", Lease: time.Microsecond})
	holder := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "w", Lease: time.Hour})
	enqueue(t, stale, "k")
	require.Equal(t, []string{"k"}, claim(t, stale, 10))
	require.Equal(t, []string{"k"}, claim(t, holder, 10), "the expired lease is claimed again")

	err := stale.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
	var lost *postgres.LeaseLostError
	require.ErrorAs(t, err, &lost)
	assert.ErrorIs(t, err, postgres.ErrLeaseLost)
	assert.Equal(t, &postgres.LeaseLostError{Key: "k", Owner: "w"}, lost)
	assert.ErrorIs(t, stale.Renew(ctx, "k"), postgres.ErrLeaseLost)
	got, err := holder.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StatePending, got.State, "the stale outcome changed nothing")
	assert.Zero(t, got.Attempts)

	before := leaseOf(t, s, "k")
	require.NoError(t, holder.Renew(ctx, "k"))
	after := leaseOf(t, s, "k")
	assert.True(t, after.Expires.After(*before.Expires), "Renew extends the lease")
	require.NoError(t, holder.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
	err = holder.Renew(ctx, "k")
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, &postgres.LeaseLostError{Key: "k"}, lost, "a finished entry has no lease to renew")

	// A lease that expired without being claimed again does not stop
	// its worker.
	enqueue(t, stale, "late")
	require.Equal(t, []string{"late"}, claim(t, stale, 10))
	assert.NoError(t, stale.Finish(ctx, "late", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))

	assert.ErrorIs(t, holder.Renew(ctx, "nope"), idemhttp.ErrNotFound)
}

// TestJournalDatabaseClock: without ClientClock, Created and Updated are
// the database's now(), whatever the worker's clock says.
func TestJournalDatabaseClock(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	var dbNow time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	j := postgres.NewJournal(pool, nil)
	e := entry("k", 0) // created at base, in 2025
	_, err := j.Begin(ctx, e)
	require.NoError(t, err)
	got, err := j.Get(ctx, "k")
	require.NoError(t, err)
	assert.WithinDuration(t, dbNow, got.Created, time.Minute)
	assert.WithinDuration(t, dbNow, got.Updated, time.Minute)

	require.NoError(t, j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: base}))
	got, err = j.Get(ctx, "k")
	require.NoError(t, err)
	assert.WithinDuration(t, dbNow, got.Updated, time.Minute)
}
