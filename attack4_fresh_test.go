package idemhttp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fresh-eyes attack on the last fixes of the previous session
// (attack4): the two "fresh-key 409" rules. Each test is named after the
// bug it pins.

// keyedServer is an API with an idempotency layer: a request whose key
// is being served gets 409 in progress (an IETF problem, as idemserver
// answers); a key served before gets its first answer replayed. The
// first request's handler waits for release, after telling arrived.
type keyedServer struct {
	mu       sync.Mutex
	inflight map[string]bool
	done     map[string]bool
	runs     int
	arrived  chan struct{}
	release  chan struct{}
	once     sync.Once
}

func newKeyedServer() *keyedServer {
	return &keyedServer{inflight: map[string]bool{}, done: map[string]bool{}, arrived: make(chan struct{}), release: make(chan struct{})}
}

func (s *keyedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	switch {
	case s.done[key]:
		s.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
		return
	case s.inflight[key]:
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"type":"https://iana.org/assignments/http-problem-types#idempotency-key-in-use","title":"request in progress"}`)
		return
	}
	s.inflight[key] = true
	s.runs++
	s.mu.Unlock()
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.arrived)
		<-s.release
	}
	s.mu.Lock()
	delete(s.inflight, key)
	s.done[key] = true
	s.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

// wrappedJournal is a caller's wrapper around a Journal (metrics,
// tracing), one per Client: it forwards the Journal interface only.
type wrappedJournal struct{ Journal }

// TestTwoClientsOnOneJournalThroughWrappers: two Clients share one
// journal, each through a wrapper of its own (a pointer: a per-Client
// metrics decorator). The senders' slots are scoped by the journal value,
// so the two Clients' calls do not share them: Resume on B resent the
// entry A's Do had just begun, under A's minted key, before A's first
// attempt went out. A's first attempt then got the server's 409 in
// progress, which the fresh-key rule took for the application's answer:
// A returned a 409 to its caller and recorded the operation done with
// status 409, although it ran once and succeeded (201). A rerun of the
// operation is then told it ended in a conflict.
//
// Fixed (journal_identity.go): a wrapper reveals the journal it wraps
// with Unwrap() Journal, which scopes the slots; without it, as here, the
// journal is not known to be one process's, and a 409 to a minted key's
// first attempt is waited out as a request in progress, never taken for
// the application's answer. Checked to fail with the fix reverted, and
// with oneProcess always true: A gets 409, the entry is done with 409.
func TestTwoClientsOnOneJournalThroughWrappers(t *testing.T) {
	srv := newKeyedServer()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	j := newRecJournal()
	b := &Client{Journal: &wrappedJournal{j}, Policy: fast()}
	a := &Client{Journal: &wrappedJournal{j}, Policy: &Policy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
	resumed := make(chan []ResumeResult, 1)
	a.PrepareRequest = func(*http.Request) error {
		// A's entry is begun: B's Resume finds it and sends it first.
		go func() {
			rs, _ := b.Resume(context.Background(), nil)
			resumed <- rs
		}()
		select {
		case <-srv.arrived:
		case <-time.After(2 * time.Second): // B waits for A's slot: nothing arrives
		}
		return nil
	}
	go func() {
		// Once A's first attempt has had its answer, B's request ends.
		time.Sleep(200 * time.Millisecond)
		close(srv.release)
	}()
	resp, err := a.Do(post(t, hs.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-shared")))
	require.NoError(t, err)
	_ = resp.Body.Close()
	<-resumed
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "A was told the operation conflicted")
	e, err := j.Lookup(context.Background(), "op-shared")
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, e.LastStatus, "the journal records the operation as a 409")
	assert.Equal(t, 1, srv.runs)
}

// fleetWrapper forwards every optional method the Journal's doc lists
// (HighWater, Now, Retain, PendingCount) of a fleet's journal, as a
// careful wrapper author would: but not ClaimPending, which the doc does
// not list and which the fresh-key rule reads as "shared by a fleet".
type fleetWrapper struct{ sharedRecJournal }

// Hide ClaimPending: a wrapper that forwards what the doc lists only.
func (fleetWrapper) ClaimPending() {}

// TestFresh409InAFleetThroughAWrapper: TestFresh409InAFleetIsInProgress
// (the simulator's seed 1013) with the fleet's journal behind a wrapper
// that forwards the optional methods the Journal's doc lists. The
// fresh-key rule learns that a journal is shared from ClaimPending alone,
// which the doc does not name: the 409 of another worker's request in
// progress was returned as the application's answer and the operation
// recorded done. The rule fails open: an unknown journal counts as one
// process's.
//
// Fixed the fail-closed way: a minted key counts as fresh only with a
// journal known to be one process's (contract.Senders, which the fleet's
// journal, like contrib/postgres's, declares false, and which the wrapper
// here promotes from the journal it embeds); a bare 409 otherwise waits
// for the in-progress patience. Checked to fail with the fix reverted, and
// with oneProcess always true: 409 after one attempt.
func TestFresh409InAFleetThroughAWrapper(t *testing.T) {
	srv, n := conflictOnce(t)
	c := &Client{Journal: fleetWrapper{sharedRecJournal{newRecJournal()}}, Policy: &Policy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
	resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-409")))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	assert.Equal(t, int32(2), n.Load())
}

// conflictOnce is a server whose first request gets 409 in progress (as
// another worker's request with the key would) and every later one 201.
func conflictOnce(t *testing.T) (*httptest.Server, *atomic.Int32) {
	n := new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"type":"https://iana.org/assignments/http-problem-types#idempotency-key-in-use","title":"request in progress"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, n
}

// TestTwoClientsThroughWrappersWithdrawWhatTheOtherSends: the severe
// form of TestTwoClientsOnOneJournalThroughWrappers. A's Do begins the
// operation's entry under a minted key; B's Resume (its own wrapper, so
// its own slots) resends it; A's own attempt is refused at the dial
// (provably not sent), so A withdraws the entry and tells its caller
// ErrNotSent: "nothing ran, try again under a new key". But B's resend
// ran the operation under the old key: the caller's rerun runs it a
// second time.
//
// Fixed as TestTwoClientsOnOneJournalThroughWrappers: the wrappers have
// no Unwrap, so the journal is not known to the client, and A keeps the
// entry pending instead of withdrawing it; its error is not ErrNotSent.
// Checked to fail with the fix reverted (A's error ErrNotSent while the
// server ran the operation), and with withdrawal allowed for any journal
// (mayWithdraw true: A deleted the entry, B's outcome was lost, and the
// rerun ran the operation a second time).
func TestTwoClientsThroughWrappersWithdrawWhatTheOtherSends(t *testing.T) {
	srv := newKeyedServer()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	j := newRecJournal()
	b := &Client{Journal: &wrappedJournal{j}, Policy: fast()}
	refused := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}}
	a := &Client{Journal: &wrappedJournal{j}, HTTPClient: &http.Client{Transport: refused}, Policy: &Policy{MaxAttempts: 1}}
	resumed := make(chan struct{})
	a.PrepareRequest = func(*http.Request) error {
		go func() {
			_, _ = b.Resume(context.Background(), nil)
			close(resumed)
		}()
		select {
		case <-srv.arrived:
		case <-time.After(2 * time.Second): // B waits for A's slot: nothing arrives
		}
		return nil
	}
	_, err := a.Do(post(t, hs.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-shared")))
	close(srv.release)
	<-resumed
	require.Error(t, err)
	srv.mu.Lock()
	runs := srv.runs
	srv.mu.Unlock()
	assert.False(t, errors.Is(err, ErrNotSent) && runs > 0, "A said not sent (rerun under a new key) while B's resend ran it %d time(s)", runs)
	// Nor may A withdraw the entry B sends under, told or not: a rerun of
	// the operation would begin it anew under a new key.
	_, err = (&Client{Journal: &wrappedJournal{j}, Policy: fast()}).Do(post(t, hs.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-shared")))
	assert.ErrorIs(t, err, ErrAlreadyDone, "the rerun sees B's outcome")
	srv.mu.Lock()
	assert.Equal(t, 1, srv.runs, "the operation ran once")
	srv.mu.Unlock()
}
