package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recJournal is a memJournal that logs the order of journal writes
// against server-side events, and can be made to fail.
type recJournal struct {
	*memJournal
	mu        sync.Mutex
	events    []string
	failBegin error
	failFin   error
}

func newRecJournal() *recJournal { return &recJournal{memJournal: newMemJournal(24 * time.Hour)} }

// JournalSenders declares the journal one process's, as the memJournal
// it embeds does, with the recJournal as its store: the tests' wrappers
// that embed it (valueJournal, fencingJournal...) promote it, as a
// caller's wrapper embedding *filejournal.Journal does.
func (r *recJournal) JournalSenders() contract.Senders {
	return contract.Senders{Store: r, OneProcess: true}
}

func (r *recJournal) log(ev string) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
}

func (r *recJournal) Events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func (r *recJournal) Begin(ctx context.Context, e *Entry) (*Entry, error) {
	if r.failBegin != nil {
		return nil, r.failBegin
	}
	old, err := r.memJournal.Begin(ctx, e)
	r.log("begin")
	return old, err
}

func (r *recJournal) Finish(ctx context.Context, key string, o Outcome) error {
	if r.failFin != nil {
		return r.failFin
	}
	r.log("finish:" + string(o.State))
	return r.memJournal.Finish(ctx, key, o)
}

func TestJournalEntryIsWrittenBeforeTheFirstAttempt(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		j.log("request")
		w.WriteHeader(200)
	})
	c := &Client{Policy: unnamed(nil), Journal: j}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"begin", "request", "finish:done"}, j.Events())

	e, err := j.Get(context.Background(), srv.Hits()[0].Key)
	require.NoError(t, err)
	assert.Equal(t, StateDone, e.State)
	assert.Equal(t, 1, e.Attempts)
	assert.Equal(t, 200, e.LastStatus)
	assert.Equal(t, chargeBody, string(e.Body))
	assert.Equal(t, contract.Fingerprint("POST", srv.URL, []byte(chargeBody)), e.Fingerprint)
}

func TestJournalStates(t *testing.T) {
	tests := []struct {
		name      string
		giveSteps []step
		wantState State
		wantErr   error
	}{
		{"2xx is done", []step{reply(201, "")}, StateDone, nil},
		{"404 is done", []step{reply(404, "")}, StateDone, nil},
		{"replayed 500 is done", []step{reply(500, "", "Idempotent-Replayed", "true")}, StateDone, nil},
		{"mismatch is done", []step{drop, reply(422, `{"title":"Idempotency-Key reused"}`)}, StateDone, ErrKeyMismatch},
		{"exhausted stays pending", []step{reply(503, "")}, StatePending, ErrExhausted},
		{"409 forever stays pending", []step{drop, reply(409, "")}, StatePending, ErrInProgress},
		{"lost responses stay pending", []step{drop}, StatePending, ErrExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newRecJournal()
			srv := newScripted(t, tt.giveSteps...)
			c := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, InProgressPatience: 20 * time.Millisecond})}
			resp, err := c.Do(post(t, srv.URL, chargeBody))
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
			} else {
				require.NoError(t, err)
				resp.Body.Close()
			}
			e, err := j.Get(context.Background(), srv.Hits()[0].Key)
			require.NoError(t, err)
			assert.Equal(t, tt.wantState, e.State)
			assert.Equal(t, len(srv.Hits()), e.Attempts)
		})
	}
}

func TestJournalNeverHoldsSecrets(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(200, ""))
	c := &Client{Policy: unnamed(nil), Journal: j, SecretHeaders: []string{"X-Api-Key"}, PrepareRequest: func(r *http.Request) error {
		r.Header.Set("X-Signature", "sig-from-hook")
		return nil
	}}
	// Credentials in the URL cannot be journaled without writing them
	// down, nor dropped without making a resend fail: refused, unsent.
	_, err := c.Do(post(t, "http://user:pa55word@"+strings.TrimPrefix(srv.URL, "http://")+"/v1/charges", chargeBody))
	require.ErrorIs(t, err, ErrInvalidRequest)
	require.Empty(t, srv.Hits(), "refused before sending")

	req := post(t, srv.URL+"/v1/charges?page=2#pa55word", chargeBody)
	req.Header.Set("Authorization", "Bearer sk_live_secret")
	req.Header.Set("Cookie", "session=secret-cookie")
	req.Header.Set("Proxy-Authorization", "Basic cHJveHk6c2VjcmV0")
	req.Header.Set("X-Api-Key", "custom-secret")
	req.Header.Set("X-Trace", "kept")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()

	h := srv.Hits()[0]
	assert.Equal(t, "Bearer sk_live_secret", h.Header.Get("Authorization"), "the server still gets credentials")
	assert.Equal(t, "sig-from-hook", h.Header.Get("X-Signature"))
	e, err := j.Get(context.Background(), h.Key)
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "X-Trace": {"kept"}}, e.Header)
	assert.NotContains(t, e.URL, "pa55word")
}

func TestJournalBeginFailureSendsNothing(t *testing.T) {
	j := newRecJournal()
	j.failBegin = errors.New("disk full")
	srv := newScripted(t, reply(200, ""))
	c := &Client{Policy: unnamed(nil), Journal: j}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	assert.Nil(t, resp)
	assert.ErrorContains(t, err, "disk full")
	assert.Empty(t, srv.Hits())
}

func TestJournalFinishFailureIsLoggedNotReturned(t *testing.T) {
	j := newRecJournal()
	j.failFin = errors.New("disk full")
	srv := newScripted(t, reply(200, ""))
	var buf bytes.Buffer
	c := &Client{Policy: unnamed(nil), Journal: j, Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err, "the charge went through; the caller must know")
	resp.Body.Close()
	assert.Contains(t, buf.String(), "journal finish failed")
	e, err := j.Get(context.Background(), srv.Hits()[0].Key)
	require.NoError(t, err)
	assert.Equal(t, StatePending, e.State, "Resume will resolve it with the same key")
}

func TestOperationRerunReusesJournaledKey(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(503, ""), reply(200, "{}", "Idempotent-Replayed", "true"))
	ctx := WithOperation(context.Background(), "batch-line-17")
	first := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 1})}
	_, err := first.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.ErrorIs(t, err, ErrExhausted)

	second := &Client{Policy: unnamed(nil), Journal: j} // a new process, same journal
	resp, err := second.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.NoError(t, err)
	resp.Body.Close()
	hits := srv.Hits()
	assert.Equal(t, hits[0].Key, hits[1].Key)
	e, err := j.Get(context.Background(), hits[0].Key)
	require.NoError(t, err)
	assert.Equal(t, 2, e.Attempts, "attempts add up across processes")
	assert.Equal(t, StateDone, e.State)

	_, err = second.Do(post(t, srv.URL, `{"amount":1}`).WithContext(ctx))
	assert.ErrorIs(t, err, ErrKeyMismatch)
	_, err = second.Do(post(t, srv.URL, chargeBody).WithContext(WithKey(ctx, "another-key")))
	assert.ErrorIs(t, err, ErrKeyConflict)
	assert.Len(t, srv.Hits(), 2)
}

func TestExpiredEntriesAreNotResent(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(200, ""))
	old := time.Now().Add(-25 * time.Hour)
	_, err := j.Begin(context.Background(), &Entry{
		Operation: "stale-op", Key: "stale-key", Method: "POST", URL: srv.URL, Body: []byte(chargeBody),
		Fingerprint: contract.Fingerprint("POST", srv.URL, []byte(chargeBody)), Created: old, Updated: old, State: StatePending,
	})
	require.NoError(t, err)
	c := &Client{Policy: unnamed(nil), Journal: j}

	results, err := c.Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, ErrKeyExpired)
	assert.Empty(t, srv.Hits(), "an expired key is never blindly resent")
	e, err := j.Get(context.Background(), "stale-key")
	require.NoError(t, err)
	assert.Equal(t, StateAbandoned, e.State)

	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "stale-op")))
	assert.ErrorIs(t, err, ErrKeyExpired)
	assert.Empty(t, srv.Hits())
}

func TestResumeWithoutStoredBodyRefuses(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(200, ""))
	now := time.Now()
	_, err := j.Begin(context.Background(), &Entry{
		Key: "k-nobody", Method: "POST", URL: srv.URL,
		Fingerprint: contract.Fingerprint("POST", srv.URL, []byte(chargeBody)), Created: now, Updated: now, State: StatePending,
	})
	require.NoError(t, err)
	results, err := (&Client{Policy: unnamed(nil), Journal: j}).Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, ErrNotReplayable)
	assert.Empty(t, srv.Hits())
}

func TestResumeTakesCredentialsFromTheLiveClient(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(503, ""), reply(200, "{}"))
	req := post(t, srv.URL, chargeBody)
	req.Header.Set("Authorization", "Bearer sk_old")
	_, err := (&Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 1})}).Do(req)
	require.ErrorIs(t, err, ErrExhausted)

	live := &Client{Policy: unnamed(nil), Journal: j, PrepareRequest: func(r *http.Request) error {
		r.Header.Set("Authorization", "Bearer sk_rotated")
		return nil
	}}
	results, err := live.Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	require.NoError(t, results[0].Err)
	hits := srv.Hits()
	require.Len(t, hits, 2)
	assert.Equal(t, hits[0].Key, hits[1].Key)
	assert.Equal(t, "Bearer sk_rotated", hits[1].Header.Get("Authorization"))
	assert.Equal(t, "application/json", hits[1].Header.Get("Content-Type"), "safe headers come from the journal")
}

func TestMemJournalPrunesOnlyOldDoneEntries(t *testing.T) {
	m := newMemJournal(time.Hour)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour)
	for _, e := range []*Entry{
		{Key: "done-old", Operation: "a", State: StateDone, Updated: old},
		{Key: "pending-old", State: StatePending, Updated: old},
		{Key: "abandoned-old", State: StateAbandoned, Updated: old},
		{Key: "done-new", State: StateDone, Updated: time.Now()},
	} {
		// Begin stores it pending (Entry.Sanitized); Finish gives it its
		// state.
		_, err := m.Begin(ctx, &Entry{Key: e.Key, Operation: e.Operation, Created: e.Updated})
		require.NoError(t, err)
		require.NoError(t, m.Finish(ctx, e.Key, Outcome{State: e.State, At: e.Updated}))
	}
	n, err := m.Prune(ctx, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	_, err = m.Get(ctx, "done-old")
	assert.ErrorIs(t, err, ErrNotFound)
	assert.ErrorIs(t, m.Finish(ctx, "done-old", Outcome{State: StateDone}), ErrNotFound)
	existing, err := m.Begin(ctx, &Entry{Key: "fresh", Operation: "a"})
	require.NoError(t, err)
	assert.Nil(t, existing, "the pruned operation is free again")
}

func TestResumeGivenEntriesConcurrently(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(200, "{}"))
	now := time.Now()
	for i := range 8 {
		body := []byte(fmt.Sprintf(`{"n":%d}`, i))
		_, err := j.Begin(context.Background(), &Entry{
			Key: fmt.Sprintf("k-%d", i), Method: "POST", URL: srv.URL, Body: body,
			Fingerprint: contract.Fingerprint("POST", srv.URL, body), Created: now, Updated: now, State: StatePending,
		})
		require.NoError(t, err)
	}
	c := &Client{Policy: unnamed(nil), Journal: j}
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	var wg sync.WaitGroup
	results := make([]ResumeResult, len(pending))
	for i, e := range pending {
		wg.Go(func() {
			rs, err := c.Resume(context.Background(), &ResumeOptions{Entries: []*Entry{e}})
			assert.NoError(t, err)
			if assert.Len(t, rs, 1) {
				results[i] = rs[0]
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		assert.NoError(t, r.Err)
		assert.Equal(t, 200, r.StatusCode)
	}
	left, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Empty(t, left)
	assert.Len(t, srv.Hits(), 8)
}

// A clock set back makes journaled times lie in the future: the entries'
// ages, and so whether the server still holds their keys, are unknown, so
// nothing is resent and the entries stay pending. Without the check, the
// future entry below (created "in an hour", really much older) would be
// resent as young.
func TestResumeRefusesWhenTheClockJumpedBack(t *testing.T) {
	ctx := context.Background()
	j := newRecJournal()
	srv := newScripted(t, reply(200, "{}"), reply(200, "{}"))
	now := time.Now()
	future := now.Add(time.Hour)
	for _, e := range []*Entry{
		{Key: "k-future", Operation: "op-future", Created: future, Updated: future},
		{Key: "k-now", Created: now, Updated: now},
	} {
		e.Method, e.URL, e.Body, e.State = "POST", srv.URL, []byte(chargeBody), StatePending
		e.Fingerprint = contract.Fingerprint("POST", srv.URL, e.Body)
		_, err := j.Begin(ctx, e)
		require.NoError(t, err)
	}
	c := &Client{Policy: unnamed(nil), Journal: j}

	results, err := c.Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, results, 2)
	for _, r := range results {
		assert.ErrorIs(t, r.Err, ErrClockJump, r.Entry.Key)
	}
	assert.Empty(t, srv.Hits(), "nothing resent while the clock is behind the journal")
	rs, _ := c.Resume(ctx, &ResumeOptions{Entries: []*Entry{results[1].Entry}})
	r := rs[0]
	assert.ErrorIs(t, r.Err, ErrClockJump, "a resend of given entries checks them too")
	for _, k := range []string{"k-future", "k-now"} {
		e, err := j.Get(ctx, k)
		require.NoError(t, err)
		assert.Equal(t, StatePending, e.State, "left pending, not abandoned")
	}

	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-future")))
	assert.ErrorIs(t, err, ErrClockJump, "a rerun of the operation is refused too")
	assert.Empty(t, srv.Hits())
}

// Headers set straight into the map bypass canonical names; the client
// still keeps them, the key header and the caller's secrets out of the
// journal. Before SafeHeader's rule, Header.Del missed "authorization".
func TestJournalNeverSeesSecretsInAnyCase(t *testing.T) {
	j := newRecJournal()
	srv := newScripted(t, reply(200, "{}"))
	req := post(t, srv.URL, chargeBody)
	req.Header["authorization"] = []string{"Bearer sk_live_lower"}
	req.Header["COOKIE"] = []string{"s=upper"}
	req.Header["x-api-key"] = []string{"k_123"}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&Client{Journal: j, SecretHeaders: []string{"X-Api-Key"}}).Do(req.WithContext(WithOperation(context.Background(), "op-secret")))
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	e, err := j.Lookup(context.Background(), "op-secret")
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, e.Header)
}
