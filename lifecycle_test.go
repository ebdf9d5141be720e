package idemhttp

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
)

// phases records the lifecycle moves of a Client's calls.
type phases struct {
	mu    sync.Mutex
	moves []string
}

func (p *phases) on(from, to phase) {
	p.mu.Lock()
	p.moves = append(p.moves, from.String()+">"+to.String())
	p.mu.Unlock()
}

func (p *phases) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.moves, " ")
}

// Each transition of the lifecycle, with the evidence that makes it
// (docs/lifecycle.md), seen from the outside of a call.
func TestLifecycleTransitions(t *testing.T) {
	ctx := context.Background()
	dead := "http://" + deadAddr(t)
	tests := []struct {
		name  string
		steps []step // nil: the dead address
		pol   *Policy
		op    string
		pre   func(j *recJournal, fp string) // the journal before the call; fp is the request's fingerprint
		want  string
	}{
		{name: "answered", steps: []step{reply(201, "{}")},
			want: "minted>journaled journaled>attempting attempting>maybe-sent maybe-sent>done"},
		{name: "refused on every attempt: withdrawn", pol: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond},
			want: "minted>journaled journaled>attempting attempting>not-sent not-sent>attempting attempting>not-sent not-sent>withdrawn"},
		{name: "lost response: pending", steps: []step{drop}, pol: &Policy{MaxAttempts: 1},
			want: "minted>journaled journaled>attempting attempting>maybe-sent maybe-sent>pending"},
		{name: "sent, then refused: still pending", steps: []step{drop}, pol: &Policy{MaxAttempts: 3, BaseDelay: time.Millisecond},
			want: "minted>journaled journaled>attempting attempting>maybe-sent maybe-sent>attempting attempting>maybe-sent maybe-sent>attempting attempting>maybe-sent maybe-sent>pending"},
		{name: "rerun of a done operation: answered locally", steps: []step{reply(201, "{}")}, op: "op-done",
			pre: func(j *recJournal, fp string) {
				_, _ = j.Begin(ctx, &Entry{Operation: "op-done", Key: "k-done", Method: "POST", Fingerprint: fp, State: StatePending, Created: time.Now()})
				_ = j.Finish(ctx, "k-done", Outcome{State: StateDone, Status: 201, Attempts: 1, At: time.Now()})
			},
			want: "minted>answered"},
		{name: "rerun past the retention: abandoned", steps: []step{reply(201, "{}")}, op: "op-old",
			pre: func(j *recJournal, fp string) {
				old := time.Now().Add(-25 * time.Hour)
				_, _ = j.Begin(ctx, &Entry{Operation: "op-old", Key: "k-old", Method: "POST", Fingerprint: fp, State: StatePending, Created: old, Updated: old})
			},
			want: "minted>journaled journaled>abandoned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := dead
			if tt.steps != nil {
				u = newScripted(t, tt.steps...).URL
			}
			j := newRecJournal()
			if tt.pre != nil {
				tt.pre(j, contract.Fingerprint("POST", u, []byte(chargeBody)))
			}
			var ph phases
			pol := tt.pol
			if pol == nil {
				pol = fast()
			}
			c := &Client{Journal: j, Policy: unnamed(pol), onPhase: ph.on}
			req := post(t, u, chargeBody)
			if tt.op != "" {
				req = req.WithContext(WithOperation(ctx, tt.op))
			}
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			assert.Equal(t, tt.want, ph.String())
		})
	}
}

// The moves that must never happen are refused: an operation that may
// have run is never withdrawn, and a final phase never moves on.
func TestLifecycleRefusesWhatMustNeverHappen(t *testing.T) {
	for _, tt := range []struct{ from, to phase }{
		{phaseMaybeSent, phaseWithdrawn},
		{phaseMaybeSent, phaseNotSent},
		{phaseNotSent, phaseDone},
		{phaseDone, phasePending},
		{phaseWithdrawn, phaseAttempting},
		{phaseAbandoned, phaseAttempting},
		{phasePending, phaseDone},
		{phaseAnswered, phaseAttempting},
		{phaseMinted, phaseDone},
	} {
		a := &operation{phase: tt.from}
		saved := lifecycleBug
		lifecycleBug = nil // this test makes them on purpose
		ok := a.advance(tt.to)
		lifecycleBug = saved
		assert.False(t, ok, "%s -> %s", tt.from, tt.to)
		assert.Equal(t, tt.from, a.phase, "the call keeps its phase")
		assert.Len(t, a.badMoves, 1)
	}
}

// Issue 22 §2.4: a call whose attempts all failed without writing a byte
// leaves no entry a later Resume would send, however many attempts it
// made and however the last one failed, and says so (ErrNotSent), so the
// caller's own retry and Resume cannot both run it. Attempt 1 is refused
// (dial), attempt 2 fails its DNS lookup: before, the entry was withdrawn
// only when the call stopped before its first attempt, and this one
// stayed pending. Checked to fail with outcome() returning pending for
// not-sent calls: the entry stayed, and Resume sent it after the caller's
// own rerun had.
func TestCallThatSentNothingLeavesNothing(t *testing.T) {
	srv := newScripted(t, reply(201, "{}"))
	dead := deadAddr(t)
	var dials atomic.Int32
	tr := &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) >= 2 {
			return nil, &net.OpError{Op: "dial", Net: network, Err: &net.DNSError{Err: "no such host", Name: "api.invalid", IsNotFound: true}}
		}
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}}
	defer tr.CloseIdleConnections()
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}), HTTPClient: &http.Client{Transport: tr}}
	_, err := c.Do(post(t, "http://"+dead+"/v1/charges", chargeBody))
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNotSent)
	assert.EqualValues(t, 2, dials.Load(), "two attempts, the second failing its lookup")
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Empty(t, pending, "withdrawn")

	// The caller fixes things and runs the operation again (a new key):
	// Resume has nothing to send behind its back.
	resp, err := (&Client{Policy: unnamed(nil), Journal: j}).Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()
	results, err := (&Client{Policy: unnamed(nil), Journal: j}).Resume(context.Background(), nil)
	require.NoError(t, err)
	assert.Empty(t, results)
	assert.Len(t, srv.Hits(), 1, "the operation ran once")
}

// A rerun of an operation an earlier run may have sent keeps its entry
// pending when its own attempts send nothing, and its error does not say
// ErrNotSent: the earlier run may have charged.
func TestRerunThatSentNothingKeepsThePendingEntry(t *testing.T) {
	ctx := WithOperation(context.Background(), "op-1")
	srv := newScripted(t, drop)
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 1})}
	_, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.Error(t, err, "the response was lost")
	srv.Close()
	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotSent)
	e, err := j.Lookup(context.Background(), "op-1")
	require.NoError(t, err)
	assert.Equal(t, StatePending, e.State)
}

// Issue 22 §2.3: two concurrent calls of one operation. The second waits
// for the first and then sees its outcome: the operation runs once, and
// the journal keeps the entry while anyone sends under it. Checked to fail
// with hold() taking no slot: both sent at once, the server ran the
// operation twice (no server-side dedup here), and the second call's
// withdrawal could race the first's send.
func TestOneSenderPerOperation(t *testing.T) {
	release := make(chan struct{})
	var inFlight, maxInFlight, runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		runs.Add(1)
		<-release
		inFlight.Add(-1)
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(fast())}
	ctx := WithOperation(context.Background(), "order-7")
	type result struct {
		status int
		err    error
	}
	results := make(chan result, 2)
	call := func() {
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
		if err != nil {
			results <- result{err: err}
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		results <- result{status: resp.StatusCode}
	}
	go call()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	go call()
	// The second call is waiting for the first: it has not sent.
	require.Eventually(t, func() bool { return slots.waiters(j) == 1 || runs.Load() > 1 }, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, runs.Load())
	close(release)
	first, second := <-results, <-results
	if first.err != nil {
		first, second = second, first
	}
	assert.Equal(t, 201, first.status)
	assert.ErrorIs(t, second.err, ErrAlreadyDone, "the second saw the first's outcome")
	assert.EqualValues(t, 1, runs.Load(), "the operation ran once")
	assert.EqualValues(t, 1, maxInFlight.Load())
}

// A caller's key without a journal: two concurrent calls with one key
// are sent one after the other, never at once.
func TestOneSenderPerCallerKey(t *testing.T) {
	var inFlight, maxInFlight atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		inFlight.Add(-1)
		w.WriteHeader(200)
	}))
	defer srv.Close()
	c := &Client{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			req := post(t, srv.URL, chargeBody)
			req.Header.Set("Idempotency-Key", "caller-key-9")
			resp, err := c.Do(req)
			if assert.NoError(t, err) {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, maxInFlight.Load())
}

// Resume meeting an entry that a live call is sending under waits for it,
// rereads the entry, and sends nothing when the call finished it.
func TestResumeWaitsForALiveSender(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		<-release
		w.WriteHeader(201)
	}))
	defer srv.Close()
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(fast())}
	done := make(chan error, 1)
	go func() {
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-live")))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return runs.Load() == 1 }, 5*time.Second, time.Millisecond)
	resumed := make(chan []ResumeResult, 1)
	go func() {
		rs, err := c.Resume(context.Background(), nil)
		assert.NoError(t, err)
		resumed <- rs
	}()
	require.Eventually(t, func() bool { return slots.waiters(j) == 1 || runs.Load() > 1 }, 5*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, runs.Load(), "Resume waits, it does not send")
	close(release)
	require.NoError(t, <-done)
	rs := <-resumed
	require.Len(t, rs, 1)
	assert.ErrorIs(t, rs[0].Err, ErrAlreadyDone, "finished while Resume waited")
	assert.EqualValues(t, 1, runs.Load())
}

// Issue 22 §2.1 and §3b: a keyed request, or one carrying PrepareRequest
// headers or secret headers, is never followed to another origin, neither
// by the client nor by the *http.Client StandardClient returns; the 3xx
// comes back. (A plain Client and a keyed request is the case the suite
// did not see.) Checked to fail with StandardClient's CheckRedirect
// removed: net/http followed the 307 returned by the client, and the
// other origin got the key and the body.
func TestRedirectRulesHoldForEveryEntryPoint(t *testing.T) {
	var otherHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherHits.Add(1)
		w.WriteHeader(200)
	}))
	defer other.Close()
	origin := newScripted(t, reply(307, "", "Location", other.URL+"/v1/charges"))
	tests := []struct {
		name string
		c    *Client
		sdk  bool
		req  func() *http.Request
	}{
		{"keyed, plain Client", &Client{}, false, func() *http.Request { return post(t, origin.URL, chargeBody) }},
		{"keyed, StandardClient", &Client{}, true, func() *http.Request { return post(t, origin.URL, chargeBody) }},
		{"PrepareRequest headers, StandardClient", &Client{Policy: &Policy{KeyMethods: []string{}}, PrepareRequest: func(r *http.Request) error {
			r.Header.Set("X-Api-Key", "k")
			return nil
		}}, true, func() *http.Request { return post(t, origin.URL, chargeBody) }},
		{"secret header, StandardClient", &Client{Policy: &Policy{KeyMethods: []string{}}, SecretHeaders: []string{"X-Token"}}, true, func() *http.Request {
			r := post(t, origin.URL, chargeBody)
			r.Header.Set("X-Token", "t")
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			do := tt.c.Do
			if tt.sdk {
				do = tt.c.StandardClient().Do
			}
			resp, err := do(tt.req())
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, 307, resp.StatusCode, "the 3xx comes back")
			assert.Zero(t, otherHits.Load(), "the other origin got nothing")
		})
	}
}

// Issue 22 §2.7: a 3xx returned instead of followed ran nothing at its
// target: the operation is not done, and a rerun sends it again (same
// key). Checked to fail with outcome() taking every response for done:
// the rerun got ErrAlreadyDone.
func TestUnfollowedRedirectIsNotDone(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	defer other.Close()
	origin := newScripted(t, reply(307, "", "Location", other.URL))
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(fast())}
	ctx := WithOperation(context.Background(), "op-redirected")
	for range 2 {
		resp, err := c.Do(post(t, origin.URL, chargeBody).WithContext(ctx))
		require.NoError(t, err, "not ErrAlreadyDone")
		resp.Body.Close()
		assert.Equal(t, 307, resp.StatusCode)
	}
	hits := origin.Hits()
	require.Len(t, hits, 2)
	assert.Equal(t, hits[0].Key, hits[1].Key)
	e, err := j.Lookup(context.Background(), "op-redirected")
	require.NoError(t, err)
	assert.Equal(t, StatePending, e.State)
}

// Issue 22 §2.8: with a cookie jar, each attempt carries the jar's cookies
// once (attempt 3 sent session=s1 three times), and the caller's Header
// is never modified, keyed or not. Checked to fail with the jar back on
// the engine's http.Client: "session=s1; session=s1" on attempt 3.
func TestJarCookiesOncePerAttempt(t *testing.T) {
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		t.Run(method, func(t *testing.T) {
			var mu sync.Mutex
			var cookies []string
			var n atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				cookies = append(cookies, r.Header.Get("Cookie"))
				mu.Unlock()
				http.SetCookie(w, &http.Cookie{Name: "session", Value: "s1"})
				if n.Add(1) < 3 {
					w.WriteHeader(503)
					return
				}
				w.WriteHeader(200)
			}))
			defer srv.Close()
			jar, err := cookiejar.New(nil)
			require.NoError(t, err)
			c := &Client{Policy: fast(), HTTPClient: &http.Client{Jar: jar}}
			req, err := http.NewRequest(method, srv.URL, strings.NewReader(chargeBody))
			require.NoError(t, err)
			before := req.Header.Clone()
			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, []string{"", "session=s1", "session=s1"}, cookies)
			assert.Equal(t, before, req.Header, "the caller's header is the caller's")
		})
	}
}

// Issue 22 §2.6 and §3b: secrets never leave through the error chain: the
// *url.Error inside a *GiveUpError, RetryEvent.Err and its URL, the retry
// log's error attribute, the untouched error of an unkeyed request, and
// every string of them, carry the redacted URL: no user part (a password,
// or Stripe's sk_live_ key as user name), no secret query value (Google's
// key= among them), no path after Policy.RedactPathAfter, no fragment.
// Checked to fail with redact() a no-op: net/http's *url.Error showed the
// user name and every query value.
func TestSecretsNeverLeaveThroughErrors(t *testing.T) {
	secrets := []string{"sk_live_user", "pw123", "qsecret", "gkey", "hooktoken", "fragsecret"}
	check := func(t *testing.T, what, s string) {
		t.Helper()
		for _, sec := range secrets {
			assert.NotContains(t, s, sec, what)
		}
	}
	var logs bytes.Buffer
	var events []idemtrace.RetryEvent
	c := &Client{
		Policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, RedactPathAfter: []string{"/hooks/"}},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Hooks:  &idemtrace.Hooks{OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) { events = append(events, ev) }},
	}
	raw := "http://sk_live_user:pw123@" + deadAddr(t) + "/hooks/hooktoken?api_key=qsecret&key=gkey#fragsecret"
	_, err := c.Do(post(t, raw, chargeBody))
	require.Error(t, err)
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	check(t, "the error", err.Error())
	check(t, "GiveUpError.URL", g.URL)
	var ue *url.Error
	require.ErrorAs(t, err, &ue)
	check(t, "the *url.Error", ue.URL)
	require.NotEmpty(t, events)
	for _, ev := range events {
		check(t, "RetryEvent.URL", ev.URL)
		check(t, "RetryEvent.Err", ev.Err.Error())
	}
	check(t, "the log", logs.String())
	assert.Contains(t, logs.String(), "REDACTED")

	// The untouched error of an unkeyed POST whose outcome is unknown.
	srv := newScripted(t, drop)
	u, _ := url.Parse(srv.URL)
	unkeyed := &Client{Policy: &Policy{KeyMethods: []string{}}}
	_, err = unkeyed.Do(post(t, "http://sk_live_user:pw123@"+u.Host+"/x?token=qsecret", chargeBody))
	require.Error(t, err)
	check(t, "the untouched error", err.Error())
	require.ErrorAs(t, err, &ue)
}

// §3b: every default secret query name is redacted in errors and refused
// by a journal: a table over the whole list, written out here so that a
// name dropped from the code's list fails. Checked to fail with
// "client_secret" dropped from contract.DefaultSecretQuery.
func TestEveryDefaultSecretQueryNameIsRedactedAndRefused(t *testing.T) {
	addr := deadAddr(t)
	names := []string{
		"access_token", "api_key", "apikey", "api-key", "auth", "authorization",
		"client_secret", "code", "id_token", "password", "passwd", "refresh_token",
		"secret", "session", "sig", "signature", "token",
		"x-amz-credential", "x-amz-security-token", "x-amz-signature",
		"x-goog-credential", "x-goog-signature", "key",
	}
	assert.ElementsMatch(t, names, contract.DefaultSecretQuery[:], "the documented list")
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			raw := "http://" + addr + "/v1?" + url.QueryEscape(strings.ToUpper(name)) + "=s3cr3t"
			c := &Client{Policy: &Policy{MaxAttempts: 1}}
			_, err := c.Do(post(t, raw, chargeBody))
			require.Error(t, err)
			assert.NotContains(t, err.Error(), "s3cr3t")

			j := newRecJournal()
			_, err = (&Client{Policy: unnamed(nil), Journal: j}).Do(post(t, raw, chargeBody))
			assert.ErrorIs(t, err, ErrInvalidRequest, "a journal would write it to disk")
			assert.Empty(t, j.Events(), "refused before the journal")
		})
	}
}

// §3b: Do under WithOperation meeting a pending entry older than the
// retention, without a Resume first, refuses (ErrKeyExpired), sends
// nothing, and marks it abandoned. Checked to fail with the retention
// check removed from judge: the entry was resent under a key the server
// had forgotten.
func TestRerunOfAnExpiredPendingEntryRefuses(t *testing.T) {
	ctx := context.Background()
	srv := newScripted(t, reply(201, "{}"))
	j := newRecJournal()
	old := time.Now().Add(-25 * time.Hour)
	_, err := j.Begin(ctx, &Entry{Operation: "op-old", Key: "k-old", Method: "POST", URL: srv.URL,
		Fingerprint: contract.Fingerprint("POST", srv.URL, []byte(chargeBody)), State: StatePending, Created: old, Updated: old})
	require.NoError(t, err)
	_, err = (&Client{Journal: j}).Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-old")))
	assert.ErrorIs(t, err, ErrKeyExpired)
	assert.NotErrorIs(t, err, ErrNotSent)
	assert.Empty(t, srv.Hits())
	e, err := j.Get(ctx, "k-old")
	require.NoError(t, err)
	assert.Equal(t, StateAbandoned, e.State)
}

// §3b: NewKey draws all of its random bits: over a few hundred keys every
// one of the 122 random bit positions of a version 4 UUID takes both
// values. Checked to fail with rand.Read filling only the first 8 bytes.
func TestNewKeyDrawsEveryRandomBit(t *testing.T) {
	var ones, zeros [16]byte
	for range 400 {
		b, err := hex.DecodeString(strings.ReplaceAll(NewKey(), "-", ""))
		require.NoError(t, err)
		require.Len(t, b, 16)
		for i := range b {
			ones[i] |= b[i]
			zeros[i] |= ^b[i]
		}
	}
	for i := range 16 {
		fixed := byte(0)
		switch i {
		case 6:
			fixed = 0xf0 // the version
		case 8:
			fixed = 0xc0 // the variant
		}
		assert.Equal(t, byte(0xff)&^fixed, ones[i]&zeros[i]&^fixed, "byte %d: a random bit never varied", i)
	}
}

// Issue 26 §1: with KeepResults, a rerun of a done operation gets its
// result back as a replay and sends nothing; a body over the limit is not
// kept (a partial copy is no result), and the rerun gets DoneError. With
// RefetchDone, a rerun within the retention asks the server again with
// the key (the server replays); past it, DoneError. Checked to fail with
// judge ignoring Result: the rerun got DoneError.
func TestDoneOperationReturnsItsResult(t *testing.T) {
	ctx := context.Background()
	t.Run("kept", func(t *testing.T) {
		srv := newScripted(t, reply(201, `{"id":"ch_1"}`, "Content-Type", "application/json", "Set-Cookie", "s=1", "Request-Id", "req_1"))
		c := &Client{Policy: &Policy{KeepResults: 1 << 10}}
		octx := WithOperation(ctx, "charge-1")
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(octx))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, `{"id":"ch_1"}`, string(body), "the caller still reads the body")

		resp, err = c.Do(post(t, srv.URL, chargeBody).WithContext(octx))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ = io.ReadAll(resp.Body)
		assert.Equal(t, 201, resp.StatusCode)
		assert.Equal(t, `{"id":"ch_1"}`, string(body))
		assert.True(t, Replayed(resp))
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.Equal(t, "req_1", resp.Header.Get("Request-Id"))
		assert.Empty(t, resp.Header.Get("Set-Cookie"), "never Set-Cookie")
		info, ok := ResponseInfo(resp)
		require.True(t, ok)
		assert.True(t, info.FromJournal)
		assert.Len(t, srv.Hits(), 1, "nothing sent")
	})
	t.Run("too large", func(t *testing.T) {
		srv := newScripted(t, reply(201, strings.Repeat("x", 100)))
		c := &Client{Policy: &Policy{KeepResults: 10}}
		octx := WithOperation(ctx, "charge-2")
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(octx))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Len(t, body, 100, "read whole")
		_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(octx))
		assert.ErrorIs(t, err, ErrAlreadyDone)
	})
	t.Run("refetch", func(t *testing.T) {
		srv := newScripted(t, reply(201, `{"id":"ch_3"}`), reply(201, `{"id":"ch_3"}`, "Idempotent-Replayed", "true"))
		c := &Client{Policy: &Policy{RefetchDone: true}}
		octx := WithOperation(ctx, "charge-3")
		for range 2 {
			resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(octx))
			require.NoError(t, err)
			resp.Body.Close()
		}
		hits := srv.Hits()
		require.Len(t, hits, 2)
		assert.Equal(t, hits[0].Key, hits[1].Key, "asked again under its key")
	})
}

// Issue 31 §2.15: a journaled call without an operation id is refused
// by default, before anything is written or sent, with an error naming
// the fix; Policy.AllowUnnamed lets it through. A rerun of the same work
// would otherwise mint a new key and charge again. Checked to fail with
// the refusal behind the old opt-in (RequireOperation): the call was
// journaled and sent.
func TestUnnamedJournaledCallIsRefusedByDefault(t *testing.T) {
	srv := newScripted(t, reply(201, "{}"))
	j := newRecJournal()
	c := &Client{Journal: j}
	_, err := c.Do(post(t, srv.URL, chargeBody))
	assert.ErrorIs(t, err, ErrInvalidRequest)
	assert.ErrorIs(t, err, ErrNotSent)
	assert.ErrorContains(t, err, "WithOperation")
	assert.ErrorContains(t, err, "Policy.AllowUnnamed")
	assert.Empty(t, srv.Hits())
	assert.Empty(t, j.Events(), "nothing journaled")

	resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op")))
	require.NoError(t, err)
	resp.Body.Close()

	resp, err = (&Client{Journal: j, Policy: &Policy{AllowUnnamed: true}}).Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err, "the explicit opt-out")
	resp.Body.Close()
	assert.Len(t, srv.Hits(), 2)

	resp, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithKey(context.Background(), "order-9-capture")))
	require.NoError(t, err, "a key of the caller's own names the operation")
	resp.Body.Close()
	assert.Len(t, srv.Hits(), 3)

	// Through StandardClient, as an SDK would call, with a key of its own
	// in the header (stripe-go mints one per call): the same rule.
	req := post(t, srv.URL, chargeBody)
	req.Header.Set("Idempotency-Key", NewKey())
	_, err = c.StandardClient().Do(req)
	assert.ErrorIs(t, err, ErrInvalidRequest)
	assert.Len(t, srv.Hits(), 3)
}

// Issue 22 §2.5, end to end over both protocols: an attempt that times out
// after its connection was obtained is outcome-unknown (the entry stays
// pending, the error is not ErrNotSent), while a refused connection is
// not sent, over HTTP/1.1 and HTTP/2 alike. (Which HTTP/2 evidence counts
// is pinned by TestWireDecidesNotSent; here the request head reaches the
// server, so this shows the path, not the HTTP/2 rule alone.)
func TestTimeoutAfterConnectingIsUnknownOnBothProtocols(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			hang := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					return // the warm-up
				}
				select {
				case <-hang:
				case <-r.Context().Done():
				}
			}))
			if h2 {
				srv.EnableHTTP2 = true
				srv.StartTLS()
			} else {
				srv.Start()
			}
			defer srv.Close()
			defer close(hang)
			hc := srv.Client()
			// The connection (and, for h2, its TLS handshake) is made
			// before the timed call, so that the timeout falls after
			// connecting whatever the machine's load: a handshake that
			// outlived the timeout would rightly be "not sent", and the
			// test would then fail for the wrong reason.
			warm, err := hc.Get(srv.URL)
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, warm.Body)
			require.NoError(t, warm.Body.Close())
			hc.Timeout = 50 * time.Millisecond
			j := newRecJournal()
			c := &Client{Journal: j, HTTPClient: hc, Policy: unnamed(&Policy{MaxAttempts: 1})}
			_, err = c.Do(post(t, srv.URL, chargeBody))
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrNotSent)
			pending, err := j.Pending(context.Background())
			require.NoError(t, err)
			assert.Len(t, pending, 1, "kept for Resume")

			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			require.NoError(t, ln.Close())
			scheme := "http"
			if h2 {
				scheme = "https"
			}
			_, err = c.Do(post(t, scheme+"://"+addr, chargeBody))
			assert.ErrorIs(t, err, ErrNotSent, "refused: nothing left")
		})
	}
}

// failingJournal fails Delete and Finish: a disk that broke after the
// call's Begin.
type failingJournal struct{ *recJournal }

func (f failingJournal) Delete(context.Context, string) error { return errors.New("EIO") }
func (f failingJournal) Finish(context.Context, string, Outcome) error {
	return errors.New("EIO")
}

// A call that sent nothing but could not withdraw its entry (nor mark it
// abandoned) does not say ErrNotSent: the entry stays pending, and Resume
// may send it, so a retry under a new key could run the operation twice.
// Found by the simulator (seed 5). Checked to fail with settle wrapping
// ErrNotSent before the withdrawal.
func TestFailedWithdrawalIsNotNotSent(t *testing.T) {
	j := failingJournal{newRecJournal()}
	c := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 1})}
	_, err := c.Do(post(t, "http://"+deadAddr(t), chargeBody))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotSent)
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Len(t, pending, 1, "left for Resume")
}
