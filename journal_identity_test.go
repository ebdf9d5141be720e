package idemhttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unwrapJournal is a caller's wrapper that reveals the journal it wraps,
// as the Journal's doc asks of one.
type unwrapJournal struct{ Journal }

func (u *unwrapJournal) Unwrap() Journal { return u.Journal }

// selfJournal's Unwrap returns itself: a cycle.
type selfJournal struct{ Journal }

func (s *selfJournal) Unwrap() Journal { return s }

// nilJournal's Unwrap returns nil: it wraps nothing.
type nilJournal struct{ Journal }

func (nilJournal) Unwrap() Journal { return nil }

// panicUnwrap's Unwrap panics.
type panicUnwrap struct{ Journal }

func (panicUnwrap) Unwrap() Journal { panic("unwrap") }

// mapJournal is a wrapper whose value cannot be a map key.
type mapJournal struct {
	Journal
	tags map[string]string
}

// mapUnwrap is a wrapper with Unwrap whose value cannot be a map key.
type mapUnwrap struct {
	Journal
	tags map[string]string
}

func (m mapUnwrap) Unwrap() Journal { return m.Journal }

// highJournal is a wrapper with a HighWater of its own.
type highJournal struct {
	unwrapJournal
	at time.Time
}

func (h *highJournal) HighWater(context.Context) (time.Time, error) { return h.at, nil }

// innerHigh is a journal of the project's kind with a HighWater.
type innerHigh struct {
	*recJournal
	at time.Time
}

func (i innerHigh) HighWater(context.Context) (time.Time, error) { return i.at, nil }

// What the client knows of a journal through its wrappers: the slots'
// scope is the journal the project's declaration names, however it is
// reached; anything else is unknown (neither withdrawn from nor fresh),
// and a walk that cannot end (a cycle, a panic, a chain too deep) sees
// no declaration. Checked to fail with resolveJournal ignoring Unwrap
// (the wrapped rows unknown, scoped by the wrapper), with the cycle check
// removed (the cycle row unknown only by the depth bound: it still
// passes, which is why the bound exists), and with the recover removed
// (the test panics), and with the depth bound removed (the deep chain
// known).
func TestResolveJournal(t *testing.T) {
	r := newRecJournal()
	own := new(int)
	var deep Journal = r
	for range maxUnwrap {
		deep = &unwrapJournal{deep}
	}
	mj := mapJournal{r, map[string]string{}}
	uw := &unwrapJournal{r}
	opaque := &wrappedJournal{r}
	for _, tt := range []struct {
		name       string
		give       Journal
		wantScope  any
		known, one bool
	}{
		{"none", nil, own, false, false},
		{"the project's journal", r, r, true, true},
		{"a wrapper with Unwrap", uw, r, true, true},
		{"two wrappers with Unwrap", &unwrapJournal{uw}, r, true, true},
		{"a wrapper that embeds the journal's type", fencingJournal{r}, r, true, true},
		{"a wrapper without Unwrap", opaque, opaque, false, false},
		{"a fleet's journal", sharedRecJournal{r}, r, true, false},
		{"a fleet's journal through a wrapper", &unwrapJournal{sharedRecJournal{r}}, r, true, false},
		{"a wrapper without Unwrap, not comparable", mj, own, false, false},
		{"a wrapper with Unwrap, not comparable", mapUnwrap{uw, map[string]string{}}, r, true, true},
		{"a cycle", &selfJournal{r}, nil, false, false},
		{"Unwrap returns nil", nilJournal{r}, nilJournal{r}, false, false},
		{"Unwrap panics", panicUnwrap{r}, panicUnwrap{r}, false, false},
		{"a chain deeper than the bound", deep, nil, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := resolveJournal(tt.give, own)
			if tt.wantScope != nil {
				assert.Equal(t, tt.wantScope, id.scope)
			}
			assert.Equal(t, tt.known, id.known, "known")
			assert.Equal(t, tt.one, id.oneProcess, "one process")
		})
	}
}

// An optional method is found through Unwrap where the wrapper has none
// of its own, and a wrapper's own wins. Checked to fail with journalAs
// looking at the first journal only (the wrapper's PendingCount and the
// inner HighWater unseen), and with the chain searched innermost first
// (the wrapper's HighWater lost to the journal's).
func TestOptionalMethodsThroughUnwrap(t *testing.T) {
	inner, outer := time.Unix(100, 0), time.Unix(200, 0)
	r := newRecJournal()
	j := innerHigh{r, inner}

	id := resolveJournal(&unwrapJournal{j}, nil)
	cj, ok := journalAs[clockJournal](&id)
	require.True(t, ok, "the journal's HighWater, through the wrapper")
	got, _ := cj.HighWater(context.Background())
	assert.Equal(t, inner, got)

	id = resolveJournal(&highJournal{unwrapJournal{j}, outer}, nil)
	cj, ok = journalAs[clockJournal](&id)
	require.True(t, ok)
	got, _ = cj.HighWater(context.Background())
	assert.Equal(t, outer, got, "the wrapper's own wins")

	// Through the API: Stats counts the pending entries of the journal a
	// wrapper reveals, and cannot through one that hides it.
	_, err := r.Begin(context.Background(), &Entry{Key: "k1", Method: "POST", URL: "http://h/", State: StatePending, Created: time.Now()})
	require.NoError(t, err)
	assert.Equal(t, 1, (&Client{Journal: &unwrapJournal{r}}).Stats().JournalPending)
	assert.Equal(t, -1, (&Client{Journal: opaqueJournal{r}}).Stats().JournalPending)
}

// refusedClient is a Client whose every dial is refused: provably not
// sent.
func refusedClient(j Journal) *Client {
	refused := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}}
	return &Client{Journal: j, HTTPClient: &http.Client{Transport: refused}, Policy: &Policy{MaxAttempts: 1}}
}

// TestTwoClientsThroughWrappersWithdrawWhatTheOtherSends with wrappers
// that implement Unwrap: the two Clients share the journal's slots, so
// B's Resume waits for A's call, A withdraws the entry it never sent and
// says ErrNotSent, and B then finds nothing to send. Checked to fail with
// resolveJournal ignoring Unwrap: B sent under A's key while A held it,
// and A's error was not ErrNotSent (the entry kept pending).
func TestWrappersWithUnwrapShareTheSlots(t *testing.T) {
	var runs atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer hs.Close()
	j := newRecJournal()
	b := &Client{Journal: &unwrapJournal{j}, Policy: fast()}
	a := refusedClient(&unwrapJournal{j})
	resumed := make(chan []ResumeResult, 1)
	a.PrepareRequest = func(*http.Request) error {
		go func() {
			rs, _ := b.Resume(context.Background(), nil)
			resumed <- rs
		}()
		// B's resend waits for A's slot (or, with the slots not shared,
		// runs).
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if slots.waiters(j) > 0 || runs.Load() > 0 {
				break
			}
		}
		return nil
	}
	_, err := a.Do(post(t, hs.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-unwrap")))
	rs := <-resumed
	assert.ErrorIs(t, err, ErrNotSent)
	assert.Zero(t, runs.Load(), "B resent nothing A withdrew")
	require.Len(t, rs, 1)
	assert.ErrorIs(t, rs[0].Err, ErrNotFound, "B found the entry withdrawn")
	_, err = j.Lookup(context.Background(), "op-unwrap")
	assert.ErrorIs(t, err, ErrNotFound)
}

// A call that provably sent nothing, through a journal the client does
// not know (here a wrapper without Unwrap; a user's own journal is the
// same), keeps its entry pending rather than withdrawing it, and says so:
// not ErrNotSent, since a sender out of sight may be using the key.
// Resume sends it later, once. Through a wrapper with Unwrap the entry is
// withdrawn and the call is ErrNotSent. Checked to fail with mayWithdraw
// always true (the entry withdrawn through the opaque wrapper) and with
// keptUnsent returning its error unchanged (the message says nothing).
func TestUnknownJournalKeepsAnUnsentEntry(t *testing.T) {
	var runs atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer hs.Close()
	ctx := WithOperation(context.Background(), "op-kept")

	j := newRecJournal()
	_, err := refusedClient(&wrappedJournal{j}).Do(post(t, hs.URL, chargeBody).WithContext(ctx))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotSent)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the call's own error stays reachable")
	var kept *keptPendingError
	assert.True(t, errors.As(err, &kept))
	assert.Contains(t, err.Error(), "stays pending")
	e, err := j.Lookup(context.Background(), "op-kept")
	require.NoError(t, err, "the entry is kept")
	assert.Equal(t, StatePending, e.State)
	assert.Equal(t, 1, e.Attempts)

	rs, err := (&Client{Journal: &wrappedJournal{j}, Policy: fast()}).Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, rs, 1)
	assert.NoError(t, rs[0].Err)
	assert.Equal(t, int32(1), runs.Load())

	j = newRecJournal()
	_, err = refusedClient(&unwrapJournal{j}).Do(post(t, hs.URL, chargeBody).WithContext(ctx))
	assert.ErrorIs(t, err, ErrNotSent)
	_, err = j.Lookup(context.Background(), "op-kept")
	assert.ErrorIs(t, err, ErrNotFound, "withdrawn")
}

// The fresh-key rule through wrappers: a 409 to the first attempt under
// a minted key is the application's answer only with a journal known to
// be one process's; through a wrapper without Unwrap it is waited out as
// a request in progress (here it clears: 201 on the second attempt).
// Checked to fail with oneProcess always true (the opaque row got 409
// after one attempt) and with it always false (the Unwrap row waited).
func TestFresh409ThroughWrappers(t *testing.T) {
	for _, tt := range []struct {
		name       string
		wrap       func(Journal) Journal
		wantStatus int
		wantHits   int32
	}{
		{"the journal", func(j Journal) Journal { return j }, http.StatusConflict, 1},
		{"a wrapper with Unwrap", func(j Journal) Journal { return &unwrapJournal{j} }, http.StatusConflict, 1},
		{"a wrapper without Unwrap", func(j Journal) Journal { return &wrappedJournal{j} }, http.StatusCreated, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, n := conflictOnce(t)
			c := &Client{Journal: tt.wrap(newRecJournal()), Policy: &Policy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
			resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-409")))
			require.NoError(t, err)
			_ = resp.Body.Close()
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			assert.Equal(t, tt.wantHits, n.Load())
		})
	}
}
