// Package journaltest is the conformance suite for implementations of
// [idemhttp.Journal]: every journal, embedded or in a nested module
// (PostgreSQL, Redis), must pass [Run] unchanged. A journal shared by a
// fleet of workers, which leases entries to them ([FleetJournal]), must
// pass [RunFleet] as well: leases, fencing across workers, and one clock
// for the fleet.
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
//			j, err := filejournal.Open(filepath.Join(t.TempDir(), "journal"), nil)
//			require.NoError(t, err)
//			t.Cleanup(func() { _ = j.Close() })
//			return j
//		})
//	}
//
// [FleetModel] is the fleet contract as a model, in memory: the simulator
// runs its fleet of client machines on it, and RunFleet pins it and the
// real journals to one contract.
//
// A fleet journal's test gives two workers on one new store, and a way to
// move the store's clock (contrib/postgres shifts the database's now()):
//
//	func TestFleetConformance(t *testing.T) {
//		journaltest.RunFleet(t, func(t *testing.T) *journaltest.Fleet {
//			store, shift := newStore(t)
//			return &journaltest.Fleet{
//				A: store.Worker("a"), B: store.Worker("b"),
//				Lease: time.Minute, Retention: 24 * time.Hour, Shift: shift,
//			}
//		})
//	}
package journaltest

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// The optional methods a Client looks for on its Journal, beyond the
// interface. They are not types of the root package, which callers read:
// an implementer asserts them here, in its tests.
//
//	var _ journaltest.ClockJournal = (*MyJournal)(nil)
type (
	// ClockJournal is a journal that remembers the latest time it has ever
	// recorded (an entry's Created or Updated time, an outcome's At),
	// including the times of entries it has pruned or deleted since. A
	// Client whose journal implements it judges the clock against that
	// mark as well as against the entries still there: a clock more than
	// idemhttp.ClockTolerance below the mark was set back, so every
	// pending entry's age is in doubt, and the client neither resends nor
	// reuses one (idemhttp.ErrClockJump). Without it, the client sees the
	// jump only while entries newer than the clock are still in the
	// journal. HighWater returns the mark, never lower than before, or the
	// zero Time when the journal recorded none.
	ClockJournal interface {
		HighWater(ctx context.Context) (time.Time, error)
	}

	// PendingCounter is a journal that counts its pending entries cheaply,
	// from memory and without I/O, for Client.Stats, which health checks
	// call often.
	PendingCounter interface {
		PendingCount() int
	}

	// Clock is a journal with a clock of its own (a database's, shared by a
	// fleet of workers): it stamps entries and outcomes given with zero
	// times, and a Client judges their ages by Now, never by its own clock.
	Clock interface {
		Now(ctx context.Context) (time.Time, error)
	}

	// ClockDoubter is a journal that keeps, for good, the times it held
	// when it found its clock set back by an amount nobody measured
	// (filejournal.Journal's; a fleet journal's, which finds its
	// database's clock below the high-water mark): an entry created at or
	// before ClockDoubt's time is of unknown age, and a Client resends,
	// reuses and refetches none of them (idemhttp.ErrClockJump), however
	// far the clock has moved since. The zero Time means none.
	ClockDoubter interface {
		ClockDoubt(ctx context.Context) (time.Time, error)
	}

	// Forgetter is a journal with an operator's removal of entries a
	// person has resolved (idemctl prune -include-pending): Forget removes
	// a pending (no live lease of another worker's holding it) or
	// abandoned entry, and refuses a done one (idemhttp.ErrFenced; only
	// Prune removes those) and an unknown key (idemhttp.ErrNotFound). A
	// Client never calls it: its withdrawals are Delete, which never
	// removes an abandoned entry.
	Forgetter interface {
		Forget(ctx context.Context, key string) error
	}

	// Retainer is a journal that prunes done entries by itself: a Client
	// calls Retain once, at its first use, with its Policy.Retention, and
	// the journal never prunes a done entry younger than the longest
	// retention it was told.
	Retainer interface {
		Retain(d time.Duration)
	}
)

// Run runs the conformance suite against the journals open returns, one
// subtest at a time. A journal that implements [ClockJournal]
// is checked for it too; the others skip that subtest. open must return a new, empty journal in its default
// configuration (storing bodies) each time it is called, and release it
// with t.Cleanup. Times in the suite are whole milliseconds in UTC, so an
// implementation that stores microseconds passes; times read back are
// compared with [time.Time.Equal].
func Run(t *testing.T, open func(t *testing.T) idemhttp.Journal) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, j idemhttp.Journal)
	}{
		{"BeginStoresEntry", testBeginStoresEntry},
		{"BeginExistingKey", testBeginExistingKey},
		{"BeginExistingOperation", testBeginExistingOperation},
		{"BeginConcurrentOneWinner", testBeginConcurrentOneWinner},
		{"BeginCancelled", testBeginCancelled},
		{"BeginDoesNotModifyEntry", testBeginDoesNotModifyEntry},
		{"FinishRecordsOutcome", testFinishRecordsOutcome},
		{"FinishUnknownKey", testFinishUnknownKey},
		{"GetUnknownKey", testGetUnknownKey},
		{"GetReturnsCopy", testGetReturnsCopy},
		{"LookupByOperation", testLookupByOperation},
		{"LookupUnknownOperation", testLookupUnknownOperation},
		{"PendingOldestFirst", testPendingOldestFirst},
		{"Prune", testPrune},
		{"Delete", testDelete},
		{"FinalStatesStay", testFinalStatesStay},
		{"ResultKept", testResultKept},
		{"HeadersRoundTrip", testHeadersRoundTrip},
		{"SecretsNeverStored", testSecretsNeverStored},
		{"URLSanitized", testURLSanitized},
		{"EmptyBodyIsNotNoBody", testEmptyBodyIsNotNoBody},
		{"HighWater", testHighWater},
		{"ParkedKept", testParkedKept},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, open(t))
		})
	}
}

// base is the time every fixture is relative to.
var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// at returns base plus n seconds.
func at(n int) time.Time { return base.Add(time.Duration(n) * time.Second) }

// entry returns a pending entry for key with every field set.
func entry(key, operation string, created time.Time) *idemhttp.Entry {
	return &idemhttp.Entry{
		Operation:   operation,
		Key:         key,
		Method:      http.MethodPost,
		URL:         "https://api.example.com/v1/charges",
		Header:      http.Header{"Content-Type": {"application/json"}},
		Body:        []byte(`{"amount":100,"key":"` + key + `"}`),
		Fingerprint: "fp-" + key,
		Created:     created,
		Updated:     created,
		State:       idemhttp.StatePending,
	}
}

// assertEntry checks got field by field against want, comparing times
// with Equal so that the location and monotonic reading do not matter.
func assertEntry(t *testing.T, want, got *idemhttp.Entry) {
	t.Helper()
	require.NotNil(t, got)
	assert.Equal(t, want.Operation, got.Operation, "Operation")
	assert.Equal(t, want.Key, got.Key, "Key")
	assert.Equal(t, want.Method, got.Method, "Method")
	assert.Equal(t, want.URL, got.URL, "URL")
	assert.Equal(t, want.Header, got.Header, "Header")
	assert.Equal(t, want.Body, got.Body, "Body")
	assert.Equal(t, want.Fingerprint, got.Fingerprint, "Fingerprint")
	assert.True(t, want.Created.Equal(got.Created), "Created: want %v, got %v", want.Created, got.Created)
	assert.True(t, want.Updated.Equal(got.Updated), "Updated: want %v, got %v", want.Updated, got.Updated)
	assert.Equal(t, want.Attempts, got.Attempts, "Attempts")
	assert.Equal(t, want.LastStatus, got.LastStatus, "LastStatus")
	assert.Equal(t, want.State, got.State, "State")
}

// keys returns the keys of es, in order.
func keys(es []*idemhttp.Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Key)
	}
	return out
}

func begin(t *testing.T, j idemhttp.Journal, e *idemhttp.Entry) {
	t.Helper()
	existing, err := j.Begin(context.Background(), e)
	require.NoError(t, err)
	require.Nil(t, existing, "Begin of a new key returned an existing entry")
}

func testBeginStoresEntry(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	e := entry("k1", "op-1", at(0))
	begin(t, j, e)

	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assertEntry(t, e, got)

	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"k1"}, keys(pending))
}

func testBeginExistingKey(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	first := entry("k1", "", at(0))
	begin(t, j, first)

	again := entry("k1", "", at(5))
	again.Body = []byte("different")
	existing, err := j.Begin(ctx, again)
	require.NoError(t, err)
	assertEntry(t, first, existing)

	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assertEntry(t, first, got)
}

func testBeginExistingOperation(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	first := entry("k1", "order-42", at(0))
	begin(t, j, first)

	existing, err := j.Begin(ctx, entry("k2", "order-42", at(5)))
	require.NoError(t, err)
	assertEntry(t, first, existing)

	_, err = j.Get(ctx, "k2")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound, "the losing key must not be stored")
}

func testBeginConcurrentOneWinner(t *testing.T, j idemhttp.Journal) {
	const n = 50
	ctx := context.Background()
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		existing = make([]*idemhttp.Entry, n)
		errs     = make([]error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			existing[i], errs[i] = j.Begin(ctx, entry(fmt.Sprintf("key-%02d", i), "contended", at(i)))
		})
	}
	close(start)
	wg.Wait()

	var winners []string
	for i := range n {
		require.NoError(t, errs[i], "Begin %d", i)
		if existing[i] == nil {
			winners = append(winners, fmt.Sprintf("key-%02d", i))
		}
	}
	require.Len(t, winners, 1, "exactly one Begin must store its key")
	for i := range n {
		if existing[i] != nil {
			assert.Equal(t, winners[0], existing[i].Key, "Begin %d saw another key", i)
		}
	}
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Equal(t, winners, keys(pending))
}

func testBeginCancelled(t *testing.T, j idemhttp.Journal) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := j.Begin(ctx, entry("k1", "", at(0)))
	assert.ErrorIs(t, err, context.Canceled)

	_, err = j.Get(context.Background(), "k1")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)
}

func testBeginDoesNotModifyEntry(t *testing.T, j idemhttp.Journal) {
	e := entry("k1", "", at(0))
	e.Header.Set("Authorization", "Bearer sk_live_secret")
	want := *e
	want.Header = e.Header.Clone()
	want.Body = append([]byte(nil), e.Body...)

	begin(t, j, e)
	assert.Equal(t, &want, e)
}

func testFinishRecordsOutcome(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	e := entry("k1", "", at(0))
	begin(t, j, e)

	require.NoError(t, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 2, At: at(10)}))
	require.NoError(t, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 3, At: at(20)}))

	want := *e
	want.Attempts, want.LastStatus, want.State, want.Updated = 5, 201, idemhttp.StateDone, at(20)
	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assertEntry(t, &want, got)

	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, pending)
}

func testFinishUnknownKey(t *testing.T, j idemhttp.Journal) {
	err := j.Finish(context.Background(), "nope", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: at(0)})
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)
}

func testGetUnknownKey(t *testing.T, j idemhttp.Journal) {
	_, err := j.Get(context.Background(), "nope")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)
}

func testGetReturnsCopy(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	e := entry("k1", "", at(0))
	begin(t, j, e)

	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	got.Body[0] = 'X'
	got.Header.Set("Content-Type", "text/plain")
	got.State = idemhttp.StateDone

	again, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assertEntry(t, e, again)
}

func testLookupByOperation(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	begin(t, j, entry("k1", "op-1", at(0)))
	begin(t, j, entry("k2", "", at(1)))

	got, err := j.Lookup(ctx, "op-1")
	require.NoError(t, err)
	assert.Equal(t, "k1", got.Key)
	assert.Equal(t, "op-1", got.Operation)
	assert.Equal(t, idemhttp.StatePending, got.State)
	assert.True(t, at(0).Equal(got.Created), "Created: want %v, got %v", at(0), got.Created)

	require.NoError(t, j.Finish(ctx, "k1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 2, At: at(5)}))
	got, err = j.Lookup(ctx, "op-1")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, got.State)
	assert.Equal(t, 201, got.LastStatus)
	assert.Equal(t, 2, got.Attempts)
	assert.True(t, at(5).Equal(got.Updated), "Updated: want %v, got %v", at(5), got.Updated)

	// The request, which Lookup may leave out, is one Get away.
	full, err := j.Get(ctx, got.Key)
	require.NoError(t, err)
	assert.Equal(t, entry("k1", "op-1", at(0)).Body, full.Body)
}

func testLookupUnknownOperation(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	begin(t, j, entry("k1", "", at(0)))
	for _, op := range []string{"op-missing", "k1", ""} {
		_, err := j.Lookup(ctx, op)
		assert.ErrorIs(t, err, idemhttp.ErrNotFound, "operation %q", op)
	}
}

func testPendingOldestFirst(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	tests := []struct {
		give *idemhttp.Entry
		end  idemhttp.State // "" leaves the entry as Begin stored it
	}{
		{give: entry("c", "", at(30))},
		{give: entry("a", "", at(10))},
		{give: entry("done", "", at(5)), end: idemhttp.StateDone},
		{give: entry("abandoned", "", at(6)), end: idemhttp.StateAbandoned},
		{give: entry("b", "", at(20))},
		{give: entry("retried", "", at(15)), end: idemhttp.StatePending},
	}
	for _, tt := range tests {
		begin(t, j, tt.give)
		if tt.end != "" {
			require.NoError(t, j.Finish(ctx, tt.give.Key, idemhttp.Outcome{State: tt.end, Attempts: 1, At: at(100)}))
		}
	}

	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "retried", "b", "c"}, keys(pending))
}

func testPrune(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	cutoff := at(100)
	tests := []struct {
		give     string
		state    idemhttp.State // "" leaves the entry pending
		updated  time.Time
		wantKept bool
	}{
		{give: "done-old", state: idemhttp.StateDone, updated: at(50), wantKept: false},
		{give: "done-just-before", state: idemhttp.StateDone, updated: at(99), wantKept: false},
		{give: "done-at-cutoff", state: idemhttp.StateDone, updated: cutoff, wantKept: true},
		{give: "done-new", state: idemhttp.StateDone, updated: at(150), wantKept: true},
		{give: "pending-old", updated: at(1), wantKept: true},
		{give: "pending-retried-old", state: idemhttp.StatePending, updated: at(50), wantKept: true},
		{give: "abandoned-old", state: idemhttp.StateAbandoned, updated: at(50), wantKept: true},
	}
	for _, tt := range tests {
		begin(t, j, entry(tt.give, "op-"+tt.give, at(1)))
		if tt.state != "" {
			require.NoError(t, j.Finish(ctx, tt.give, idemhttp.Outcome{State: tt.state, Status: 200, Attempts: 1, At: tt.updated}))
		}
	}

	n, err := j.Prune(ctx, cutoff)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, tt := range tests {
		_, err := j.Get(ctx, tt.give)
		if tt.wantKept {
			assert.NoError(t, err, tt.give)
		} else {
			assert.ErrorIs(t, err, idemhttp.ErrNotFound, tt.give)
		}
	}

	// A pruned operation is forgotten: beginning it again stores the new key.
	existing, err := j.Begin(ctx, entry("k-new", "op-done-old", at(200)))
	require.NoError(t, err)
	assert.Nil(t, existing)

	n, err = j.Prune(ctx, cutoff)
	require.NoError(t, err)
	assert.Zero(t, n, "a second prune finds nothing")
}

// testDelete: Delete withdraws a pending entry and its operation, so the
// operation can begin afresh; it refuses a done one (final: only Prune
// forgets it, after the retention) and an abandoned one (final too: its
// operation keeps the key, or a rerun would begin it afresh under a new
// key though it may have run: issue 32's bugFleetExpiredRerun, seed
// 626964), and reports an unknown key. A [Forgetter]'s Forget, the
// operator's act, removes the abandoned entry. Checked to fail with the
// FleetModel's Delete allowing abandoned entries again.
func testDelete(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	begin(t, j, entry("k-pending", "op-pending", at(1)))
	begin(t, j, entry("k-done", "op-done", at(2)))
	begin(t, j, entry("k-abandoned", "op-abandoned", at(2)))
	require.NoError(t, j.Finish(ctx, "k-done", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: at(3)}))
	require.NoError(t, j.Finish(ctx, "k-abandoned", idemhttp.Outcome{State: idemhttp.StateAbandoned, Status: 503, Attempts: 1, At: at(3)}))

	for _, k := range []string{"k-done", "k-abandoned"} {
		assert.ErrorIs(t, j.Delete(ctx, k), idemhttp.ErrFenced, "%s: a final entry is never withdrawn", k)
		got, err := j.Get(ctx, k)
		require.NoError(t, err, "%s is still there", k)
		assert.NotEqual(t, idemhttp.StatePending, got.State, k)
	}
	existing, err := j.Begin(ctx, entry("k-abandoned-again", "op-abandoned", at(4)))
	require.NoError(t, err)
	if assert.NotNil(t, existing, "an abandoned operation keeps its key") {
		assert.Equal(t, "k-abandoned", existing.Key)
	}
	require.NoError(t, j.Delete(ctx, "k-pending"))
	_, err = j.Get(ctx, "k-pending")
	assert.ErrorIs(t, err, idemhttp.ErrNotFound)
	if f, ok := j.(Forgetter); ok {
		assert.ErrorIs(t, f.Forget(ctx, "k-done"), idemhttp.ErrFenced, "only Prune removes a done entry")
		require.NoError(t, f.Forget(ctx, "k-abandoned"), "the operator removes what a person resolved")
		_, err := j.Get(ctx, "k-abandoned")
		assert.ErrorIs(t, err, idemhttp.ErrNotFound)
		assert.ErrorIs(t, f.Forget(ctx, "never"), idemhttp.ErrNotFound)
	}
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, pending)
	assert.ErrorIs(t, j.Delete(ctx, "k-pending"), idemhttp.ErrNotFound, "deleted twice")
	assert.ErrorIs(t, j.Delete(ctx, "never"), idemhttp.ErrNotFound)

	existing, err = j.Begin(ctx, entry("k-again", "op-pending", at(4)))
	require.NoError(t, err)
	assert.Nil(t, existing, "a deleted operation begins afresh")
}

func testHeadersRoundTrip(t *testing.T, j idemhttp.Journal) {
	e := entry("k1", "", at(0))
	e.Header = http.Header{
		"Content-Type":   {"application/json"},
		"X-Multi":        {"one", "two", "three"},
		"X-Empty-Value":  {""},
		"Stripe-Version": {"2024-06-20"},
	}
	begin(t, j, e)

	got, err := j.Get(context.Background(), "k1")
	require.NoError(t, err)
	assert.Equal(t, e.Header, got.Header)
}

func testSecretsNeverStored(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	e := entry("k1", "op-1", at(0))
	e.Header = http.Header{
		"Authorization":       {"Bearer sk_live_secret"},
		"Cookie":              {"s=secret"},
		"Proxy-Authorization": {"Basic c2VjcmV0"},
		"Idempotency-Key":     {"k1"},
		// A caller may fill the map directly, bypassing canonical names.
		"authorization":       {"Bearer non-canonical"},
		"cookie":              {"s=lowercase"},
		"PROXY-AUTHORIZATION": {"Basic upper"},
		"idempotency-key":     {"k1"},
		// API keys under their common names, in any case.
		"X-Api-Key":            {"sk_live_secret"},
		"api-key":              {"secret"},
		"X-Auth-Token":         {"secret"},
		"X-Amz-Security-Token": {"secret"},
		"X-Goog-Api-Key":       {"secret"},
		"Content-Type":         {"application/json"},
	}
	begin(t, j, e)

	got, err := j.Get(ctx, "k1")
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, got.Header)

	existing, err := j.Begin(ctx, entry("k2", "op-1", at(1)))
	require.NoError(t, err)
	require.NotNil(t, existing)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, existing.Header)
}

func testEmptyBodyIsNotNoBody(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	tests := []struct {
		give []byte
		want []byte
	}{
		{give: nil, want: nil},
		{give: []byte{}, want: []byte{}},
		{give: []byte{0, 1, 2, 0xff}, want: []byte{0, 1, 2, 0xff}},
	}
	for i, tt := range tests {
		e := entry(fmt.Sprintf("k%d", i), "", at(i))
		e.Body = tt.give
		begin(t, j, e)
		got, err := j.Get(ctx, e.Key)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got.Body, "body %d", i)
	}
}

// A ClockJournal's mark is the latest time it ever recorded, and never
// goes down: not for an earlier outcome, nor when the entries that held
// the latest time are pruned or deleted (a prune or delete may raise it
// to the time it ran).
func testHighWater(t *testing.T, j idemhttp.Journal) {
	cj, ok := j.(ClockJournal)
	if !ok {
		t.Skip("not a ClockJournal")
	}
	ctx := context.Background()
	mark := func() time.Time {
		t.Helper()
		m, err := cj.HighWater(ctx)
		require.NoError(t, err)
		return m
	}
	assert.True(t, mark().IsZero(), "an empty journal has no mark")
	begin(t, j, entry("k-old", "op-old", at(1)))
	begin(t, j, entry("k-new", "op-new", at(10)))
	assert.True(t, at(10).Equal(mark()), "the latest Created: %v", mark())
	require.NoError(t, j.Finish(ctx, "k-new", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: at(20)}))
	assert.True(t, at(20).Equal(mark()), "an outcome's time: %v", mark())
	require.NoError(t, j.Finish(ctx, "k-old", idemhttp.Outcome{State: idemhttp.StatePending, At: at(5)}))
	assert.True(t, at(20).Equal(mark()), "an earlier outcome does not lower it: %v", mark())

	// Prune and Delete keep it, and may raise it to the time they ran
	// (filejournal.Journal records that time: the entries they drop may have
	// held the latest times).
	n, err := j.Prune(ctx, at(30))
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.False(t, mark().Before(at(20)), "pruning the newest entry keeps it: %v", mark())
	require.NoError(t, j.Delete(ctx, "k-old"))
	assert.False(t, mark().Before(at(20)), "deleting every entry keeps it: %v", mark())
}

// testFinalStatesStay: done and abandoned are final. A stale writer's
// other outcome (a worker whose lease expired gives up after another
// finished the entry; an abandon racing a success) changes nothing and is
// refused with ErrFenced; the same state only adds attempts. Otherwise a
// done entry could be revived to pending and resent, and run twice once
// the server has forgotten its key.
func testFinalStatesStay(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	begin(t, j, entry("k-done", "op-done", at(1)))
	begin(t, j, entry("k-abandoned", "op-abandoned", at(1)))
	require.NoError(t, j.Finish(ctx, "k-done", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 2, At: at(2)}))
	require.NoError(t, j.Finish(ctx, "k-abandoned", idemhttp.Outcome{State: idemhttp.StateAbandoned, Status: 503, Attempts: 1, At: at(2)}))

	for _, tt := range []struct {
		key  string
		give idemhttp.State
	}{
		{"k-done", idemhttp.StatePending},
		{"k-done", idemhttp.StateAbandoned},
		{"k-abandoned", idemhttp.StatePending},
		{"k-abandoned", idemhttp.StateDone},
	} {
		err := j.Finish(ctx, tt.key, idemhttp.Outcome{State: tt.give, Status: 500, Attempts: 1, At: at(3)})
		assert.ErrorIs(t, err, idemhttp.ErrFenced, "%s -> %s", tt.key, tt.give)
	}
	require.NoError(t, j.Finish(ctx, "k-done", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: at(4)}),
		"a second sender that got the replay")

	got, err := j.Get(ctx, "k-done")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, got.State)
	assert.Equal(t, 201, got.LastStatus, "the first outcome's status stays")
	assert.True(t, at(2).Equal(got.Updated), "and its time: %v", got.Updated)
	assert.LessOrEqual(t, 2, got.Attempts)
	got, err = j.Get(ctx, "k-abandoned")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateAbandoned, got.State)
	assert.Equal(t, 503, got.LastStatus)
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	assert.Empty(t, pending, "nothing was revived")
}

// testResultKept: a done outcome's Result (a bounded copy of the final
// response, Policy.KeepResults) is kept with the entry: Get returns it,
// and so does Begin for the operation's existing entry, which is how a
// rerun gets the result back without sending. A journal keeps what
// Outcome.Sanitized keeps, whoever calls Finish: only the headers a
// caller reads (Content-Encoding among them, never Set-Cookie), their
// URLs without credentials (a signed URL's signature, a user part).
// Checked to fail with the PostgreSQL journal's Finish not calling
// Outcome.Sanitized (it kept X-Internal-Debug and the signature).
func testResultKept(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	begin(t, j, entry("k-res", "op-res", at(1)))
	res := &idemhttp.Result{Status: 201, Body: []byte(`{"id":"ch_1"}`), Header: http.Header{
		"Content-Type": {"application/json"}, "Request-Id": {"req_1"}, "Set-Cookie": {"s=secret"},
		"Content-Encoding": {"gzip"}, "X-Internal-Debug": {"secret"},
		"Location": {"https://b.s3.amazonaws.com/o?X-Amz-Credential=AKIA%2Fsecret&X-Amz-Signature=secret&X-Amz-Expires=60"},
		"Link":     {`<https://u:secret@h/p?page=2>; rel="next"`},
	}}
	require.NoError(t, j.Finish(ctx, "k-res", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, At: at(2), Result: res}))
	want := &idemhttp.Result{Status: 201, Body: []byte(`{"id":"ch_1"}`), Header: http.Header{
		"Content-Type": {"application/json"}, "Request-Id": {"req_1"}, "Content-Encoding": {"gzip"},
		"Location": {"https://b.s3.amazonaws.com/o?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Expires=60"},
		"Link":     {`<https://REDACTED@h/p?page=2>; rel="next"`},
	}}
	got, err := j.Get(ctx, "k-res")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, got.State)
	assert.Equal(t, want, got.Result)
	existing, err := j.Begin(ctx, entry("k-other", "op-res", at(3)))
	require.NoError(t, err)
	require.NotNil(t, existing, "the operation's entry")
	assert.Equal(t, want, existing.Result, "Begin's existing entry carries its result")

	// A pending outcome carries none, and a later outcome of a done
	// entry does not change it.
	begin(t, j, entry("k-none", "op-none", at(1)))
	require.NoError(t, j.Finish(ctx, "k-none", idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, Attempts: 1, At: at(2)}))
	got, err = j.Get(ctx, "k-none")
	require.NoError(t, err)
	assert.Nil(t, got.Result)
}

// testURLSanitized: Begin applies Entry.Sanitized to the URL, given
// directly as a producer would: a user part (a Stripe-style secret key as
// user name, or a password) or a credential in the query is refused with
// ErrInvalidRequest and nothing is stored, and the error does not quote
// it; a fragment is dropped.
func testURLSanitized(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	tests := []struct {
		give string
		want string // "" for refused
	}{
		{give: "https://sk_live_4eC39HqLyjWDarjtT1zdp7dc:@api.example.com/v1/charges"},
		{give: "https://user:hunter2@api.example.com/v1/charges"},
		{give: "https://api.example.com/v1/charges?api_key=sk_live_secret"},
		{give: "https://api.example.com/v1/charges?key=AIzaSyA-secret"},
		{give: "https://api.example.com/v1/charges#frag", want: "https://api.example.com/v1/charges"},
	}
	for i, tt := range tests {
		e := entry(fmt.Sprintf("k%d", i), "", at(i))
		e.URL = tt.give
		_, err := j.Begin(ctx, e)
		if tt.want == "" {
			assert.ErrorIs(t, err, idemhttp.ErrInvalidRequest, tt.give)
			for _, secret := range []string{"sk_live", "hunter2", "AIzaSy"} {
				assert.NotContains(t, fmt.Sprint(err), secret, "the error quotes the secret")
			}
			_, err = j.Get(ctx, e.Key)
			assert.ErrorIs(t, err, idemhttp.ErrNotFound, "stored %s", tt.give)
			continue
		}
		require.NoError(t, err, tt.give)
		got, err := j.Get(ctx, e.Key)
		require.NoError(t, err)
		assert.Equal(t, tt.want, got.URL)
	}
}

// testParkedKept: a pending outcome's NotBefore (the server's
// Retry-After, when a call parked the operation) is kept with the entry:
// Get, Pending and a Begin that finds the entry return it, so that a
// Client never sends it before then. A later outcome sets it again or
// ends it: pending without one (a resend that got no answer) and done
// both clear it. A producer may begin an entry with one. Old entries,
// written before the field existed, read with none. Checked to fail with
// the file journal's Finish writing a plain finish record for a park.
func testParkedKept(t *testing.T, j idemhttp.Journal) {
	ctx := context.Background()
	nb := at(3600)
	notBefore := func(key string) time.Time {
		t.Helper()
		e, err := j.Get(ctx, key)
		require.NoError(t, err)
		return e.NotBefore
	}
	begin(t, j, entry("k-park", "op-park", at(1)))
	require.NoError(t, j.Finish(ctx, "k-park", idemhttp.Outcome{State: idemhttp.StatePending, Status: 429, Attempts: 1, At: at(2), NotBefore: nb}))
	got, err := j.Get(ctx, "k-park")
	require.NoError(t, err)
	assert.True(t, nb.Equal(got.NotBefore), "Get: %v", got.NotBefore)
	assert.Equal(t, idemhttp.StatePending, got.State)
	assert.Equal(t, 429, got.LastStatus)
	assert.Equal(t, 1, got.Attempts)
	assert.Equal(t, []byte(`{"amount":100,"key":"k-park"}`), got.Body, "the request stays")
	pending, err := j.Pending(ctx)
	require.NoError(t, err)
	require.Len(t, pending, 1)
	assert.True(t, nb.Equal(pending[0].NotBefore), "Pending: %v", pending[0].NotBefore)
	existing, err := j.Begin(ctx, entry("k-other", "op-park", at(3)))
	require.NoError(t, err)
	require.NotNil(t, existing)
	assert.True(t, nb.Equal(existing.NotBefore), "Begin's existing entry: %v", existing.NotBefore)

	require.NoError(t, j.Finish(ctx, "k-park", idemhttp.Outcome{State: idemhttp.StatePending, Status: 503, Attempts: 1, At: at(3601)}))
	assert.True(t, notBefore("k-park").IsZero(), "a later pending outcome without one ends it")
	require.NoError(t, j.Finish(ctx, "k-park", idemhttp.Outcome{State: idemhttp.StatePending, Status: 429, Attempts: 1, At: at(3602), NotBefore: at(7200)}))
	assert.True(t, at(7200).Equal(notBefore("k-park")), "parked again")
	require.NoError(t, j.Finish(ctx, "k-park", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, At: at(7201), NotBefore: at(9000)}))
	assert.True(t, notBefore("k-park").IsZero(), "done is not parked")

	e := entry("k-later", "op-later", at(4))
	e.NotBefore = at(600)
	begin(t, j, e)
	assert.True(t, at(600).Equal(notBefore("k-later")), "a producer's entry, to send after then")
	begin(t, j, entry("k-plain", "op-plain", at(5)))
	assert.True(t, notBefore("k-plain").IsZero())
}
