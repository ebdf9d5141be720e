package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// entry returns a complete pending entry for key with no times: the
// journal's clock stamps it.
func entry(key string) *idemhttp.Entry {
	return &idemhttp.Entry{
		Operation: "op-" + key,
		Key:       key,
		Method:    http.MethodPost,
		URL:       "https://api.example.com/v1/charges",
		Header:    http.Header{"Content-Type": {"application/json"}},
		Body:      []byte(`{"key":"` + key + `"}`),
	}
}

func keysOf(es []*idemhttp.Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Key)
	}
	return out
}

// skewClock makes the schema's now() the server's plus an offset, zero at
// first, and returns the function that moves the offset: the database's
// clock as every session of skewedPool sees it, running ahead or set back
// without touching the server's. It shadows pg_catalog.now() for the
// journal's statements, which call now() unqualified.
func (s *testSchema) skewClock(t *testing.T) func(d time.Duration) {
	t.Helper()
	ctx := context.Background()
	admin := s.admin(t)
	_, err := admin.Exec(ctx, `
CREATE TABLE `+s.name+`.idemtest_clock (skew interval NOT NULL);
INSERT INTO `+s.name+`.idemtest_clock VALUES (interval '0');
CREATE FUNCTION `+s.name+`.now() RETURNS timestamptz LANGUAGE sql STABLE
    AS $$ SELECT pg_catalog.now() + (SELECT skew FROM `+s.name+`.idemtest_clock) $$`)
	require.NoError(t, err)
	return func(d time.Duration) {
		_, err := admin.Exec(ctx, "UPDATE "+s.name+".idemtest_clock SET skew = skew + $1::interval", d)
		require.NoError(t, err)
	}
}

// skewedPool is pool with the schema ahead of pg_catalog on the
// search_path, so that its now() (skewClock's) wins.
func (s *testSchema) skewedPool(t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = s.name + ", pg_catalog"
	cfg.ConnConfig.RuntimeParams["application_name"] = s.name
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// fleet returns two workers' journals on s with a one-minute lease and the
// schema's clock, and the function that moves that clock.
func fleet(t *testing.T, s *testSchema) (a, b *postgres.Journal, shift func(time.Duration)) {
	t.Helper()
	shift = s.skewClock(t)
	a = postgres.NewJournal(s.skewedPool(t, 0), &postgres.JournalOptions{Worker: "a", Lease: time.Minute})
	b = postgres.NewJournal(s.skewedPool(t, 0), &postgres.JournalOptions{Worker: "b", Lease: time.Minute})
	return a, b, shift
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
	for _, k := range keys {
		existing, err := j.Enqueue(context.Background(), entry(k))
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

// TestLeaseLostIsFenced: a Client classifies every fenced refusal with
// ErrFenced, lease or final state.
func TestLeaseLostIsFenced(t *testing.T) {
	tests := []struct {
		give error
		want []error
	}{
		{give: postgres.ErrLeaseLost, want: []error{idemhttp.ErrFenced}},
		{give: &postgres.LeaseLostError{Key: "k"}, want: []error{postgres.ErrLeaseLost, idemhttp.ErrFenced}},
		{give: fmt.Errorf("finish: %w", &postgres.LeaseLostError{Key: "k", Owner: "b"}), want: []error{postgres.ErrLeaseLost, idemhttp.ErrFenced}},
	}
	for _, tt := range tests {
		for _, w := range tt.want {
			assert.ErrorIs(t, tt.give, w, "%v", tt.give)
		}
	}
}

// TestJournalFencing: the refusals say who holds the entry; two workers
// of one name are told apart by their tokens. Checked to fail with the
// lease clause removed from finishSQL's WHERE (the stale outcome then
// overwrote the entry the holder was sending) and with deleteSQL's token
// clause removed (the creator withdrew the entry its successor claimed).
func TestJournalFencing(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	shift := s.skewClock(t)
	pool := s.skewedPool(t, 0)
	stale := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "w", Lease: time.Minute})
	holder := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "w", Lease: time.Minute})
	_, err := stale.Begin(ctx, entry("k"))
	require.NoError(t, err)
	shift(2 * time.Minute)
	require.Equal(t, []string{"k"}, claim(t, holder, 10), "the expired lease is claimed again")

	var lost *postgres.LeaseLostError
	err = stale.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1})
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, &postgres.LeaseLostError{Key: "k", Owner: "w"}, lost)
	err = stale.Delete(ctx, "k")
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, &postgres.LeaseLostError{Key: "k", Owner: "w"}, lost)
	require.ErrorAs(t, stale.Renew(ctx, "k"), &lost)

	before := leaseOf(t, s, "k")
	shift(time.Second)
	require.NoError(t, holder.Renew(ctx, "k"))
	after := leaseOf(t, s, "k")
	assert.True(t, after.Expires.After(*before.Expires), "Renew extends the lease")

	shift(2 * time.Minute)
	err = stale.Delete(ctx, "k")
	require.ErrorAs(t, err, &lost, "the holder's lease expired, but it may have sent the entry")
	assert.Equal(t, &postgres.LeaseLostError{Key: "k"}, lost, "no live lease: no owner named")

	require.NoError(t, holder.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
	err = holder.Renew(ctx, "k")
	require.ErrorAs(t, err, &lost)
	assert.Equal(t, &postgres.LeaseLostError{Key: "k"}, lost, "a finished entry has no lease to renew")
	err = stale.Delete(ctx, "k")
	assert.ErrorIs(t, err, idemhttp.ErrFenced)
	assert.NotErrorIs(t, err, postgres.ErrLeaseLost, "done is final, whoever asks")
	got, err := holder.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, got.State)
	assert.Equal(t, 1, got.Attempts, "only the holder's outcome counted")
}

// TestFinishUnleased: an enqueued entry that nobody claimed can be
// finished by anyone (an operator resolving it). Checked to fail with the
// coalesce around the lease comparison removed from finishSQL: a NULL
// lease then made the fence NULL, and the entry could never be finished.
func TestFinishUnleased(t *testing.T) {
	ctx := context.Background()
	j := postgres.NewJournal(newSchema(t).pool(t, 0), nil)
	enqueue(t, j, "k")
	require.NoError(t, j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateAbandoned, Attempts: 0}))
	got, err := j.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateAbandoned, got.State)
}

func TestFinishAndLeases(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		give       []idemhttp.State // outcomes recorded in order, after a claim
		wantState  idemhttp.State
		wantStatus int
		wantLeased bool
		wantErr    error // of the last outcome
	}{
		{name: "done ends the lease", give: []idemhttp.State{idemhttp.StateDone}, wantState: idemhttp.StateDone, wantStatus: 200},
		{name: "abandoned ends the lease", give: []idemhttp.State{idemhttp.StateAbandoned}, wantState: idemhttp.StateAbandoned, wantStatus: 200},
		{name: "pending keeps the lease", give: []idemhttp.State{idemhttp.StatePending}, wantState: idemhttp.StatePending, wantStatus: 200, wantLeased: true},
		{name: "done stays done", give: []idemhttp.State{idemhttp.StateDone, idemhttp.StatePending}, wantState: idemhttp.StateDone, wantStatus: 200, wantErr: idemhttp.ErrFenced},
		{name: "a second done adds attempts", give: []idemhttp.State{idemhttp.StateDone, idemhttp.StateDone}, wantState: idemhttp.StateDone, wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSchema(t)
			j := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{Worker: "w", Lease: time.Hour})
			enqueue(t, j, "k")
			require.Equal(t, []string{"k"}, claim(t, j, 1))
			status := 200
			var err error
			for _, st := range tt.give {
				err = j.Finish(ctx, "k", idemhttp.Outcome{State: st, Status: status, Attempts: 1})
				status = 504 // a later, stale outcome's status
			}
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			} else {
				assert.NoError(t, err)
			}
			got, err := j.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, tt.wantState, got.State)
			assert.Equal(t, tt.wantStatus, got.LastStatus)
			wantAttempts := len(tt.give)
			if tt.wantErr != nil {
				wantAttempts-- // refused: changed nothing
			}
			assert.Equal(t, wantAttempts, got.Attempts)
			assert.Equal(t, tt.wantLeased, leaseOf(t, s, "k").Owner != nil)
		})
	}
}

// TestBeginTakesTheLease: a Begin that finds a pending entry leases it to
// its caller, who is about to send it; its own entry it leaves alone, and
// one with another fingerprint (which the Client refuses to send) too.
// Checked to fail with takeSQL's UPDATE removed: the creator's Delete then
// withdrew an entry another worker was sending (journaltest's
// DeleteFenced fails as well).
func TestBeginTakesTheLease(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	a, b, shift := fleet(t, s)
	_, err := a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	first := leaseOf(t, s, "k")
	shift(time.Second)
	existing, err := a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	require.NotNil(t, existing)
	assert.Equal(t, first, leaseOf(t, s, "k"), "its own entry: no write")

	other := entry("k")
	other.Body = []byte("another body")
	_, err = b.Begin(ctx, other)
	require.NoError(t, err)
	assert.Equal(t, first, leaseOf(t, s, "k"), "another fingerprint: not taken")

	_, err = b.Begin(ctx, entry("k"))
	require.NoError(t, err)
	l := leaseOf(t, s, "k")
	require.NotNil(t, l.Owner)
	assert.Equal(t, "b", *l.Owner)
	assert.ErrorIs(t, a.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}), postgres.ErrLeaseLost)
	assert.ErrorIs(t, a.Delete(ctx, "k"), postgres.ErrLeaseLost)
	require.NoError(t, b.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))

	_, err = a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	assert.Nil(t, leaseOf(t, s, "k").Owner, "a done entry is not leased again")
}

func TestJournalRefuses(t *testing.T) {
	ctx := context.Background()
	j := postgres.NewJournal(newSchema(t).pool(t, 0), nil)
	withHeader := func(name, value string) *idemhttp.Entry {
		e := entry("k")
		e.Header = http.Header{name: {value}}
		return e
	}
	withURL := func(u string) *idemhttp.Entry {
		e := entry("k")
		e.URL = u
		return e
	}
	begin := func(e *idemhttp.Entry) func() error {
		return func() error { _, err := j.Begin(ctx, e); return err }
	}
	tests := []struct {
		name string
		give func() error
		want error
	}{
		{"invalid key", begin(func() *idemhttp.Entry { e := entry("k"); e.Key = "bad key\n"; return e }()), idemhttp.ErrInvalidKey},
		{"invalid operation", begin(func() *idemhttp.Entry { e := entry("k"); e.Operation = "op\x00"; return e }()), idemhttp.ErrInvalidRequest},
		{"nil entry", begin(nil), idemhttp.ErrInvalidRequest},
		{"header not UTF-8", begin(withHeader("X-Name", "caf\xe9")), idemhttp.ErrInvalidRequest},
		{"header with NUL", begin(withHeader("X-Name", "a\x00b")), idemhttp.ErrInvalidRequest},
		{"URL that does not parse", begin(withURL("http://[::1")), idemhttp.ErrInvalidRequest},
		{"URL with a user part", begin(withURL("https://sk_live_abc123:@api.example.com/v1/charges")), idemhttp.ErrInvalidRequest},
		{"URL with a secret query value", begin(withURL("https://api.example.com/v1/charges?api_key=sk_live_abc")), idemhttp.ErrInvalidRequest},
		{"enqueued URL with a user part", func() error {
			_, err := j.Enqueue(ctx, withURL("https://sk_live_abc123:@api.example.com/v1/charges"))
			return err
		}, idemhttp.ErrInvalidRequest},
		{"negative attempts", begin(func() *idemhttp.Entry { e := entry("k"); e.Attempts = -1; return e }()), idemhttp.ErrInvalidRequest},
		{"unknown state", func() error { return j.Finish(ctx, "k", idemhttp.Outcome{State: "lost"}) }, idemhttp.ErrInvalidRequest},
		{"negative outcome attempts", func() error {
			return j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Attempts: -1})
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
	e := entry("k")
	e.URL = "https://api.example.com/v1/charges#frag"
	e.Header.Set("Authorization", "Bearer secret")
	_, err := j.Begin(ctx, e)
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

// TestJournalDatabaseClock: Now is the database's now(); entries and
// outcomes without times are stamped with it; a time given is kept, but
// never later than the clock. Checked to fail with least() removed from
// beginSQL and finishSQL (a producer's clock an hour ahead then dated the
// entry, and the fleet's high-water mark, an hour into the future).
func TestJournalDatabaseClock(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	pool := s.pool(t, 0)
	j := postgres.NewJournal(pool, nil)
	dbNow := func() time.Time {
		var now time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&now))
		return now
	}
	before := dbNow()
	now, err := j.Now(ctx)
	require.NoError(t, err)
	assert.False(t, now.Before(before), "Now %v before the database's %v", now, before)

	_, err = j.Begin(ctx, entry("stamped"))
	require.NoError(t, err)
	ahead := entry("ahead")
	ahead.Created = time.Now().Add(time.Hour)
	_, err = j.Begin(ctx, ahead)
	require.NoError(t, err)
	old := entry("old")
	old.Created = before.Add(-time.Hour).Truncate(time.Millisecond)
	_, err = j.Begin(ctx, old)
	require.NoError(t, err)
	require.NoError(t, j.Finish(ctx, "old", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: time.Now().Add(time.Hour)}))
	after := dbNow()

	for _, k := range []string{"stamped", "ahead"} {
		got, err := j.Get(ctx, k)
		require.NoError(t, err)
		for name, ts := range map[string]time.Time{"Created": got.Created, "Updated": got.Updated} {
			assert.False(t, ts.Before(before) || ts.After(after), "%s %s %v not within [%v, %v]", k, name, ts, before, after)
		}
	}
	got, err := j.Get(ctx, "old")
	require.NoError(t, err)
	assert.True(t, old.Created.Equal(got.Created), "a given earlier time is kept: %v", got.Created)
	assert.False(t, got.Updated.After(after), "an outcome's time is never past the clock: %v", got.Updated)
	mark, err := j.HighWater(ctx)
	require.NoError(t, err)
	assert.False(t, mark.After(after), "the mark %v is never past the clock %v", mark, after)
}

// TestJournalClockOption: with JournalOptions.Clock, the journal reckons
// stamps and leases by that clock alone: a lease expires when the clock
// passes it, not before.
func TestJournalClockOption(t *testing.T) {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		now = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	pool := newSchema(t).pool(t, 0)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "a", Lease: time.Minute, Clock: clock})
	b := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "b", Lease: time.Minute, Clock: clock})

	got, err := a.Now(ctx)
	require.NoError(t, err)
	assert.Equal(t, clock(), got)
	_, err = a.Begin(ctx, entry("k"))
	require.NoError(t, err)
	e, err := a.Get(ctx, "k")
	require.NoError(t, err)
	assert.True(t, clock().Equal(e.Created), "stamped by the clock: %v", e.Created)

	advance(59 * time.Second)
	assert.Empty(t, claim(t, b, 10), "the lease lasts a minute by the clock")
	advance(2 * time.Second)
	assert.Equal(t, []string{"k"}, claim(t, b, 10))
	require.NoError(t, b.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}))
	e, err = b.Get(ctx, "k")
	require.NoError(t, err)
	assert.True(t, clock().Equal(e.Updated), "finished by the clock: %v", e.Updated)
}

// TestClaimPendingAbandonsExpired: ClaimPending marks the entries older
// than the retention abandoned, by the journal's clock, and fills its
// limit with younger ones in the same call. Checked to fail with the
// abandoning CASE removed (the expired entries were handed out) and with
// the loop cut to one round (the call returned fewer than it could).
func TestClaimPendingAbandonsExpired(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	j := postgres.NewJournal(s.pool(t, 0), nil)
	j.Retain(time.Hour) // as a Client with Policy.Retention of an hour does
	now, err := j.Now(ctx)
	require.NoError(t, err)
	for i := range 10 {
		e := entry(fmt.Sprintf("expired-%d", i))
		e.Created = now.Add(-time.Hour - time.Duration(10-i)*time.Minute)
		existing, err := j.Enqueue(ctx, e)
		require.NoError(t, err)
		require.Nil(t, existing)
	}
	for i := range 3 {
		e := entry(fmt.Sprintf("fresh-%d", i))
		e.Created = now.Add(-time.Hour + time.Duration(i+1)*time.Minute)
		_, err := j.Enqueue(ctx, e)
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"fresh-0", "fresh-1", "fresh-2"}, claim(t, j, 3))
	for i := range 10 {
		got, err := j.Get(ctx, fmt.Sprintf("expired-%d", i))
		require.NoError(t, err)
		assert.Equal(t, idemhttp.StateAbandoned, got.State, got.Key)
		assert.False(t, got.Updated.Before(now), "abandoned now: %v", got.Updated)
		assert.Nil(t, leaseOf(t, s, got.Key).Owner, "abandoned, not leased")
	}
}

// TestJournalResult: a done outcome's Result is kept with the entry and
// returned by Get and by a Begin that finds the entry, not by Lookup;
// its headers are those every journal keeps (Outcome.Sanitized: never
// Set-Cookie, nor a header a caller does not read); a second done outcome keeps the first
// result; a pending outcome's result is not kept. Checked to fail with
// finishSQL's result assignment removed, and with its pending guard
// removed (the second sender's result replaced the first).
func TestJournalResult(t *testing.T) {
	ctx := context.Background()
	j := postgres.NewJournal(newSchema(t).pool(t, 0), nil)
	enqueue(t, j, "k", "p")
	res := &idemhttp.Result{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}, "Set-Cookie": {"s=secret"}, "X-Raw": {"caf\xe9"}},
		Body:   []byte(`{"id":"ch_1"}`),
	}
	require.NoError(t, j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, Result: res}))
	require.NoError(t, j.Finish(ctx, "k", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1,
		Result: &idemhttp.Result{Status: 200, Body: []byte("replay")}}))
	require.NoError(t, j.Finish(ctx, "p", idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 1, Result: res}))

	want := &idemhttp.Result{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}},
		Body:   []byte(`{"id":"ch_1"}`),
	}
	got, err := j.Get(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, want, got.Result)
	existing, err := j.Begin(ctx, entry("k"))
	require.NoError(t, err)
	require.NotNil(t, existing)
	assert.Equal(t, want, existing.Result)
	looked, err := j.Lookup(ctx, "op-k")
	require.NoError(t, err)
	assert.Nil(t, looked.Result, "Lookup leaves it out")
	got, err = j.Get(ctx, "p")
	require.NoError(t, err)
	assert.Nil(t, got.Result, "pending keeps no result")
}

// TestMigrateUpgradesJournal: Migrate adds the result column and the
// clock table to a version 2 journal, whose mark starts at its latest
// time, and running it again changes nothing.
func TestMigrateUpgradesJournal(t *testing.T) {
	ctx := context.Background()
	s := &testSchema{url: serverURL(t), name: "idemtest_" + randomHex(6)}
	admin := s.admin(t)
	latest := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	_, err := admin.Exec(ctx, `
CREATE SCHEMA `+s.name+`;
CREATE TABLE `+s.name+`.idemhttp_journal (
    key text PRIMARY KEY, operation text, method text NOT NULL, url text NOT NULL,
    header jsonb NOT NULL DEFAULT '{}', body bytea, fingerprint text NOT NULL,
    state text NOT NULL CHECK (state IN ('pending', 'done', 'abandoned')),
    created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0), last_status integer NOT NULL DEFAULT 0,
    lease_owner text, lease_expires_at timestamptz, lease_token text);
INSERT INTO `+s.name+`.idemhttp_journal (key, method, url, fingerprint, state, created_at, updated_at)
VALUES ('old', 'POST', 'https://api.example.com/', 'fp', 'done', '2030-05-06 06:00:00Z', '2030-05-06 07:08:09Z'),
       ('older', 'POST', 'https://api.example.com/', 'fp', 'pending', '2030-05-01 00:00:00Z', '2030-05-01 00:00:00Z')`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := s.admin(t).Exec(context.Background(), "DROP SCHEMA "+s.name+" CASCADE")
		require.NoError(t, err)
	})
	pool := s.pool(t, 0)
	require.NoError(t, postgres.Migrate(ctx, pool))
	require.NoError(t, postgres.Migrate(ctx, pool), "idempotent")

	j := postgres.NewJournal(pool, nil)
	mark, err := j.HighWater(ctx)
	require.NoError(t, err)
	assert.True(t, latest.Equal(mark), "the mark starts at the table's latest time: %v", mark)
	got, err := j.Get(ctx, "old")
	require.NoError(t, err)
	assert.Nil(t, got.Result)
	n, err := j.Prune(ctx, latest.Add(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, postgres.Migrate(ctx, pool))
	mark, err = j.HighWater(ctx)
	require.NoError(t, err)
	assert.True(t, latest.Equal(mark), "a later Migrate does not move it: %v", mark)
}

// TestHighWaterAcrossJournals: another process sees the mark of this
// one's writes once they run ahead of it by more than the slack, and the
// times of the rows Prune and Delete remove. Checked to fail with
// recorded's raise removed (b saw no mark) and with raiseFromDeleted
// removed from Delete (the deleted entry's time was lost to b).
func TestHighWaterAcrossJournals(t *testing.T) {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		now = time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); now = now.Add(d) }
	pool := newSchema(t).pool(t, 0)
	a := postgres.NewJournal(pool, &postgres.JournalOptions{Clock: clock})
	b := postgres.NewJournal(pool, &postgres.JournalOptions{Clock: clock})
	mark := func(j *postgres.Journal) time.Time {
		t.Helper()
		m, err := j.HighWater(ctx)
		require.NoError(t, err)
		return m
	}
	assert.True(t, mark(b).IsZero())
	_, err := a.Begin(ctx, entry("first"))
	require.NoError(t, err)
	first := clock()
	assert.True(t, first.Equal(mark(b)), "the first write raises the mark: %v", mark(b))

	advance(time.Second)
	_, err = a.Begin(ctx, entry("second"))
	require.NoError(t, err)
	assert.True(t, clock().Equal(mark(a)), "a's own mark is exact: %v", mark(a))
	assert.False(t, mark(b).Before(first), "b's may lag by the slack: %v", mark(b))

	advance(time.Minute)
	_, err = a.Begin(ctx, entry("third"))
	require.NoError(t, err)
	assert.True(t, clock().Equal(mark(b)), "past the slack, b sees it: %v", mark(b))

	advance(time.Second)
	_, err = a.Begin(ctx, entry("fourth"))
	require.NoError(t, err)
	fourth := clock()
	require.NoError(t, a.Delete(ctx, "fourth"))
	assert.True(t, fourth.Equal(mark(b)), "a deleted entry's time outlives it: %v", mark(b))
}

// TestJournalNowFails: Now reports the database's error rather than a
// clock of its own.
func TestJournalNowFails(t *testing.T) {
	pool := newSchema(t).pool(t, 0)
	j := postgres.NewJournal(pool, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := j.Now(ctx)
	assert.ErrorIs(t, err, context.Canceled)
	pool.Close()
	_, err = j.Now(context.Background())
	assert.Error(t, err)
	assert.False(t, errors.Is(err, context.Canceled))
}

// TestJournalClockSample: the clock and the mark read with an entry that
// Begin found answer the Now and HighWater that a Client asks for next,
// without a round trip (the pool is closed), and agree with the database.
// Checked to fail with the sample's use removed from Now and HighWater
// (both then failed on the closed pool).
func TestJournalClockSample(t *testing.T) {
	ctx := context.Background()
	pool := newSchema(t).pool(t, 0)
	j := postgres.NewJournal(pool, nil)
	_, err := j.Begin(ctx, entry("k"))
	require.NoError(t, err)
	var before time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&before))
	existing, err := j.Begin(ctx, entry("k"))
	require.NoError(t, err)
	require.NotNil(t, existing)
	var after time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT now()").Scan(&after))
	pool.Close()

	now, err := j.Now(ctx)
	require.NoError(t, err)
	assert.False(t, now.Before(before), "Now %v before the database's %v", now, before)
	assert.False(t, now.After(after.Add(time.Second)), "Now %v long after the database's %v", now, after)
	mark, err := j.HighWater(ctx)
	require.NoError(t, err)
	assert.True(t, existing.Created.Equal(mark), "the mark %v is the entry's time %v", mark, existing.Created)
}

// TestJournalSecretHeaders: issue 31 §1.14. A producer's direct Begin or
// Enqueue drops the headers JournalOptions.SecretHeaders names (in any
// letter case) and API keys under their common names, through the one
// sanitising step every journal uses (Entry.Sanitized): nothing of them
// reaches the table. Checked to fail with sanitize calling Sanitized
// without the journal's names (X-Partner-Secret was stored).
func TestJournalSecretHeaders(t *testing.T) {
	ctx := context.Background()
	s := newSchema(t)
	j := postgres.NewJournal(s.pool(t, 0), &postgres.JournalOptions{SecretHeaders: []string{"x-partner-secret"}})
	ways := []struct {
		key string
		put func(e *idemhttp.Entry) (*idemhttp.Entry, error)
	}{
		{"begun", func(e *idemhttp.Entry) (*idemhttp.Entry, error) { return j.Begin(ctx, e) }},
		{"enqueued", func(e *idemhttp.Entry) (*idemhttp.Entry, error) { return j.Enqueue(ctx, e) }},
	}
	for _, way := range ways {
		e := entry(way.key)
		e.Header = http.Header{
			"Content-Type":     {"application/json"},
			"X-Partner-Secret": {"partner_secret"},
			"x-api-key":        {"api_key_secret"},
		}
		existing, err := way.put(e)
		require.NoError(t, err, way.key)
		require.Nil(t, existing)
		got, err := j.Get(ctx, way.key)
		require.NoError(t, err)
		assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, got.Header, way.key)
	}
	var rows string
	require.NoError(t, s.admin(t).QueryRow(ctx, "SELECT string_agg(header::text, ' ') FROM "+s.name+".idemhttp_journal").Scan(&rows))
	assert.NotContains(t, rows, "secret")
}
