package idemhttp

// Issue 31 §3: a helper with fresh eyes attacked the client as a
// demanding user would. Each test here pins one thing it found, and is
// named after it.

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bytesJournal is a memory journal that also keeps, as an append-only
// file would, everything it was ever asked to store: what it stores of an
// entry (Entry.Sanitized) stays in its bytes after the entry is withdrawn.
type bytesJournal struct {
	*memJournal
	mu    sync.Mutex
	bytes strings.Builder
}

func newBytesJournal() *bytesJournal { return &bytesJournal{memJournal: newMemJournal(24 * time.Hour)} }

func (j *bytesJournal) Begin(ctx context.Context, e *Entry) (*Entry, error) {
	if s, err := e.Sanitized(); err == nil {
		j.mu.Lock()
		fmt.Fprintf(&j.bytes, "%s %s %s %q %v\n", s.Key, s.Method, s.URL, s.Body, s.Header)
		j.mu.Unlock()
	}
	return j.memJournal.Begin(ctx, e)
}

func (j *bytesJournal) String() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.bytes.String()
}

// A credential under a header name that is not a token ("Authorization "
// with a trailing space, "X-Api-Key:" with the colon, as a header map
// filled from configuration may have it) is no header net/http sends: the
// call is refused. But it was refused after its entry was begun, and the
// secret-name rule (matched in any letter case, not in any spelling) kept
// it, so the credential rested in the journal's bytes (a file journal's
// Begin is on disk, and its withdrawal appends a record, it erases none).
// Checked to fail with the contract's secret-header rule as it was
// (names matched by letter case only).
func TestAttackNonTokenSecretHeaderNeverReachesTheJournal(t *testing.T) {
	for _, name := range []string{"Authorization ", "X-Api-Key:", " Cookie", "Proxy-Authorization\t"} {
		t.Run(strings.TrimSpace(name), func(t *testing.T) {
			srv := newScripted(t, reply(http.StatusCreated, "{}"))
			j := newBytesJournal()
			c := &Client{Journal: j, Policy: fast()}
			req := post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-header"))
			req.Header[name] = []string{"sk_live_attack_secret"}
			_, err := c.Do(req)
			require.ErrorIs(t, err, ErrInvalidRequest, "net/http would not send it")
			assert.Empty(t, srv.Hits())
			assert.NotContains(t, j.String(), "sk_live_attack_secret", "the credential rests in the journal's bytes")
		})
	}
}

// PrepareRequest may change the outgoing request's headers freely, the
// key header among them: one that sets its own Idempotency-Key (copied
// from a template, or minted per call as an SDK would) sent the first run
// under one key and Resume's resend under another, and the server ran the
// operation twice; one that deleted it sent the retries without a key. A
// PrepareRequest that changes the key stops the call before anything is
// sent. Checked to fail without the check after PrepareRequest: the
// server saw two keys for the one operation.
func TestAttackPrepareRequestCannotChangeTheKey(t *testing.T) {
	for _, tt := range []struct {
		name    string
		prepare func(*http.Request) error
	}{
		{"a key of its own", func(r *http.Request) error { r.Header.Set("Idempotency-Key", NewKey()); return nil }},
		{"in lower case", func(r *http.Request) error { r.Header["idempotency-key"] = []string{NewKey()}; return nil }},
		{"deleted", func(r *http.Request) error { r.Header.Del("Idempotency-Key"); return nil }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, drop)
			j := newRecJournal()
			c := &Client{Journal: j, Policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}, PrepareRequest: tt.prepare}
			_, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-prepared")))
			require.ErrorIs(t, err, ErrInvalidRequest)
			assert.ErrorIs(t, err, ErrNotSent, "nothing left, under a key minted for the call")
			assert.Empty(t, srv.Hits(), "nothing sent under a key the journal does not hold")
			_, err = j.Lookup(context.Background(), "op-prepared")
			assert.ErrorIs(t, err, ErrNotFound, "withdrawn")
		})
	}
}

// A status that says the server did not apply the request (401 and 407,
// "has not been applied because it lacks valid authentication
// credentials"; 408 Request Timeout; 421 Misdirected Request; 425 Too
// Early: RFC 9110 §15.5.2, §15.5.8, §15.5.9, §15.5.20, RFC 8470) is no
// definite answer: the operation did not run, and a resend under its key
// may run it. It comes back as a response, as any 4xx does, but the entry
// stays pending for Resume and a rerun; settled done, a rerun got a
// *DoneError and the operation was lost. A 401 is what a Resume without
// PrepareRequest meets when the first run set its credentials on the
// request (the journal never keeps them): every entry it resent was
// settled done and lost. Checked to fail with outcome settling these
// statuses done.
func TestAttackNotProcessedStatusLeavesTheEntryPending(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusProxyAuthRequired, http.StatusRequestTimeout, http.StatusMisdirectedRequest, http.StatusTooEarly} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv := newScripted(t, reply(status, ""), reply(http.StatusCreated, `{"id":"ch_1"}`))
			j := newRecJournal()
			c := &Client{Journal: j, Policy: fast()}
			ctx := WithOperation(context.Background(), "op-unprocessed")
			resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
			require.NoError(t, err, "a 4xx comes back as a response")
			resp.Body.Close()
			assert.Equal(t, status, resp.StatusCode)
			e, err := j.Lookup(context.Background(), "op-unprocessed")
			require.NoError(t, err)
			assert.Equal(t, StatePending, e.State, "the operation did not run: Resume and a rerun send it")

			resp, err = c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
			require.NoError(t, err, "the rerun sends it")
			resp.Body.Close()
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			hits := srv.Hits()
			require.Len(t, hits, 2)
			assert.Equal(t, hits[0].Key, hits[1].Key, "under its key")
		})
	}
}

// A Retry-After beyond MaxRetryAfter on the last attempt the policy
// allows (MaxAttempts 1 included, as a batch that leaves retries to
// Resume sets it) parks the operation as on any other attempt: the
// server's time is known, and Resume must not send before it. The
// attempts check came first, the call gave up with ErrExhausted, and the
// entry was pending without its time: Resume sent it at once. Checked to
// fail with retry checking the attempts before the Retry-After.
func TestAttackLongRetryAfterOnTheLastAttemptParks(t *testing.T) {
	srv := newScripted(t, reply(http.StatusTooManyRequests, "", "Retry-After", "3600"), reply(http.StatusCreated, "{}"))
	clock := newTestClock(parkBase)
	c := &Client{Policy: &Policy{MaxAttempts: 1}, clock: clock.now}
	_, err := parkCall(t, c, srv.URL, "op-last")
	require.ErrorIs(t, err, ErrParked)
	assert.ErrorIs(t, err, ErrRetryAfterTooLong)

	results, err := c.Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, results, 1)
	assert.ErrorIs(t, results[0].Err, ErrParked)
	assert.Len(t, srv.Hits(), 1, "nothing sent before the server's time")
}

// The in-memory journal (WithOperation without a Journal) forgot, every
// 1024 entries, every entry created before the retention, pending and
// abandoned ones included: a rerun of an operation whose outcome was
// unknown was then begun afresh, under a new key, and the server ran it
// again. A journal keeps such an entry and refuses the rerun
// (ErrKeyExpired). Checked to fail on the memory journal as it is.
func TestAttackMemoryJournalNeverForgetsAnOperationThatMayHaveRun(t *testing.T) {
	srv := newScripted(t, drop, reply(http.StatusCreated, "{}"))
	clock := newTestClock(parkBase)
	c := &Client{Policy: &Policy{MaxAttempts: 1, Retention: time.Hour}, clock: clock.now}
	ctx := WithOperation(context.Background(), "op-forgotten")
	_, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrNotSent, "it may have run")

	clock.advance(2 * time.Hour)
	for i := range memPruneEvery {
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), fmt.Sprint("other-", i))))
		if err == nil {
			resp.Body.Close()
		}
	}
	before := len(srv.Hits())
	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	assert.ErrorIs(t, err, ErrKeyExpired, "the rerun is refused, as a journal refuses it")
	assert.Equal(t, before, len(srv.Hits()), "nothing sent again")
}

// A 3xx whose Location does not parse (a signed URL with a stray "%")
// makes net/http's Client fail with "failed to parse Location header
// %q", quoting the value: the signature reached the call's error, every
// retry's log line and the hooks, since the client redacts only the URL
// of the *url.Error, not its cause. (The call also took the 302 for an
// unknown outcome and sent the POST four times, under its key.) The
// client now hands the 3xx back unfollowed without its Location, and the
// operation stays pending. Checked to fail without hideUnparsableLocation.
func TestAttackUnparsableLocationNeverReachesAnError(t *testing.T) {
	srv := newScripted(t, reply(http.StatusFound, "", "Location", "https://b.s3.amazonaws.com/%zz?X-Amz-Signature=sk_attack_sig"))
	var logs strings.Builder
	c := &Client{Policy: fast(), Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	if err == nil {
		resp.Body.Close()
		assert.Equal(t, http.StatusFound, resp.StatusCode, "the redirect, unfollowed")
		assert.Empty(t, resp.Header.Get("Location"))
	} else {
		assert.NotContains(t, err.Error(), "sk_attack_sig")
	}
	assert.NotContains(t, logs.String(), "sk_attack_sig")
	assert.Len(t, srv.Hits(), 1, "an answer: sent once")
}
