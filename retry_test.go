package idemhttp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", " 5 ", "-1", "1.5", "99999999999999999999999", "Sun, 29 Nov 2026 12:00:30 GMT",
		"Sunday, 29-Nov-26 12:01:00 GMT", "Sun Nov 29 12:00:10 2026", "Fri, 31 Dec 9999 23:59:59 GMT", "garbage", ""} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseRetryAfter(v, now)
		if !ok && d != 0 {
			t.Fatalf("parseRetryAfter(%q) = %v but not ok", v, d)
		}
		if d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v: a negative wait", v, d)
		}
	})
}

// Issue 11, item 1: a key written into the header map in lower case is the
// key, not a reason to mint a second one beside it, and every attempt
// carries exactly one key value, over HTTP/1.1 and HTTP/2.
func TestKeyHeaderInAnyCase(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) {
			var (
				mu   sync.Mutex
				seen [][]string
				prot []string
			)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				mu.Lock()
				seen = append(seen, r.Header.Values("Idempotency-Key"))
				prot = append(prot, r.Proto)
				n := len(seen)
				mu.Unlock()
				if n == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			srv.EnableHTTP2 = proto == "HTTP/2.0"
			srv.StartTLS()
			defer srv.Close()

			c := &Client{Policy: fast(), HTTPClient: srv.Client()}
			req := post(t, srv.URL, chargeBody)
			setRaw(req.Header, "idempotency-key", []string{"order-42"})
			resp, err := c.Do(req)
			require.NoError(t, err)
			resp.Body.Close()

			mu.Lock()
			defer mu.Unlock()
			require.Len(t, seen, 2)
			for i := range seen {
				assert.Equal(t, []string{"order-42"}, seen[i], "attempt %d", i+1)
				assert.Equal(t, proto, prot[i])
			}
			assert.Equal(t, http.Header{"Content-Type": {"application/json"}, "idempotency-key": {"order-42"}}, req.Header, "the caller's header is untouched")
		})
	}
}

// Issue 11, item 1: two different key values on one request, in whatever
// spelling, are refused before anything is sent.
func TestTwoKeyValuesAreRefused(t *testing.T) {
	srv := newScripted(t, reply(200, ""))
	tests := []struct {
		name string
		give http.Header
	}{
		{"two spellings", http.Header{"Idempotency-Key": {"a"}, "idempotency-key": {"b"}}},
		{"two values", http.Header{"Idempotency-Key": {"a", "b"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := post(t, srv.URL, chargeBody)
			req.Header = tt.give
			var c Client
			_, err := c.Do(req)
			assert.ErrorIs(t, err, ErrKeyConflict)
		})
	}
	assert.Empty(t, srv.Hits())

	// One value in two spellings is one key.
	req := post(t, srv.URL, chargeBody)
	req.Header = http.Header{"Idempotency-Key": {"a"}, "IDEMPOTENCY-KEY": {"a"}}
	var c Client
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, srv.Hits(), 1)
	assert.Equal(t, []string{"a"}, srv.Hits()[0].Header.Values("Idempotency-Key"))
}

// Issue 11, item 1: the journal strips the key header and credentials in
// any letter case.
func TestJournalHeadersStrippedInAnyCase(t *testing.T) {
	srv := newScripted(t, reply(200, "{}"))
	j := newRecJournal()
	c := &Client{Policy: unnamed(nil), Journal: j, SecretHeaders: []string{"X-Api-Key"}}
	req := post(t, srv.URL, chargeBody)
	setRaw(req.Header, "authorization", []string{"Bearer sk_live_1"})
	setRaw(req.Header, "cookie", []string{"session=1"})
	setRaw(req.Header, "x-api-key", []string{"k"})
	setRaw(req.Header, "idempotency-key", []string{"op-7"})
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	e, err := j.Get(context.Background(), "op-7")
	require.NoError(t, err)
	assert.Equal(t, http.Header{"Content-Type": {"application/json"}}, e.Header)
}

// flakyListener closes the first n connections it accepts before the TLS
// handshake, so the client's handshake fails with nothing written.
type flakyListener struct {
	net.Listener
	n atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.n.Add(-1) < 0 {
			return c, err
		}
		_ = c.Close()
	}
}

// Issue 11, item 2: a failed TLS handshake wrote nothing, so even a POST
// without a key is resent.
func TestHandshakeFailureIsResentForAnyMethod(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	fl := &flakyListener{Listener: srv.Listener}
	fl.n.Store(1)
	srv.Listener = fl
	srv.StartTLS()
	defer srv.Close()

	var reasons []idemtrace.RetryReason
	c := &Client{
		Policy:     &Policy{KeyMethods: []string{}, BaseDelay: time.Millisecond},
		HTTPClient: srv.Client(),
		Hooks:      &idemtrace.Hooks{OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) { reasons = append(reasons, ev.Reason) }},
	}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, int32(1), hits.Load())
	assert.Equal(t, []idemtrace.RetryReason{idemtrace.ReasonNotSent}, reasons)
}

// Issue 11, item 2: a TLS record error that arrives after the server read
// and ran an unkeyed POST must not resend it. The old rule classified
// tls.RecordHeaderError as "never sent" by its type and ran the POST twice;
// this test fails with it (checked by restoring the type-based rule).
func TestRecordErrorAfterWriteIsNotResent(t *testing.T) {
	cert := httptest.NewTLSServer(http.NotFoundHandler())
	tlsConf := cert.TLS.Clone()
	client := cert.Client()
	cert.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	var ran atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			raw, err := l.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(raw, tlsConf)
			if _, err := http.ReadRequest(bufio.NewReader(tc)); err == nil {
				ran.Add(1) // the effect happened
			}
			// Garbage that is no TLS record: the client's TLS layer fails
			// with a RecordHeaderError, after its request was written.
			_, _ = raw.Write([]byte("\x17\x09\x09\x00\x05junk!"))
			_ = raw.Close()
		}
	}()

	c := &Client{Policy: &Policy{KeyMethods: []string{}, BaseDelay: time.Millisecond}, HTTPClient: client}
	_, err = c.Do(post(t, "https://"+l.Addr().String(), chargeBody))
	require.Error(t, err)
	var rec tls.RecordHeaderError
	assert.ErrorAs(t, err, &rec)
	assert.Equal(t, int32(1), ran.Load(), "an unkeyed POST whose outcome is unknown runs once")
	client.CloseIdleConnections()
	l.Close()
	<-done
}

// Issue 11, item 3: a call that fails before its first byte (a
// PrepareRequest error or panic) leaves no entry for Resume to send.
func TestFailureBeforeFirstByteLeavesNothingToResume(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(*http.Request) error
	}{
		{"prepare error", func(*http.Request) error { return errors.New("no credentials") }},
		{"prepare panic", func(*http.Request) error { panic("hook bug") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, reply(200, "{}"))
			j := newRecJournal()
			c := &Client{Policy: unnamed(nil), Journal: j, PrepareRequest: tt.prepare}
			func() {
				defer func() { _ = recover() }()
				_, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-1")))
				assert.Error(t, err)
			}()
			pending, err := j.Pending(context.Background())
			require.NoError(t, err)
			assert.Empty(t, pending)

			c2 := &Client{Policy: unnamed(nil), Journal: j}
			results, err := c2.Resume(context.Background(), nil)
			require.NoError(t, err)
			assert.Empty(t, results)
			assert.Empty(t, srv.Hits(), "nothing was ever sent")
		})
	}
}

// Issue 11, item 5, the common payments case: the call's own attempt times
// out while the server still runs it, the retry meets 409, and the call
// waits it out instead of spending MaxAttempts in milliseconds.
func TestTimedOutAttemptThenInProgress(t *testing.T) {
	release := make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch n.Add(1) {
		case 1:
			<-release // the first attempt is slow; its client gives up
			return
		case 2, 3, 4, 5, 6:
			w.WriteHeader(http.StatusConflict) // bare, as many servers send it
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	defer close(release)

	c := &Client{
		Policy:     &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond},
		HTTPClient: &http.Client{Timeout: 50 * time.Millisecond},
	}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusCreated, resp.StatusCode)
	info, _ := ResponseInfo(resp)
	assert.Equal(t, 7, info.Attempts)
	assert.True(t, info.UnknownOutcome)
}

// Issue 11, item 5: Retry-After: 0 on a 409 gets BaseDelay as a floor,
// and a 409 that outlives the deadline is ErrInProgress (and the deadline).
func TestInProgressFloorAndDeadline(t *testing.T) {
	srv := newScripted(t, reply(409, "", "Retry-After", "0"), reply(409, "", "Retry-After", "0"), reply(409, "", "Retry-After", "0"), reply(200, "{}"))
	c := &Client{Policy: &Policy{BaseDelay: 20 * time.Millisecond}}
	req := post(t, srv.URL, chargeBody)
	req.Header.Set("Idempotency-Key", "k-1")
	start := time.Now()
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.GreaterOrEqual(t, time.Since(start), 60*time.Millisecond, "three waits of at least BaseDelay")

	forever := newScripted(t, reply(409, "", "Retry-After", "0"))
	ctx, cancel := context.WithTimeout(WithKey(context.Background(), "k-2"), 100*time.Millisecond)
	defer cancel()
	c = &Client{Policy: fast()}
	_, err = c.Do(post(t, forever.URL, chargeBody).WithContext(ctx))
	assert.ErrorIs(t, err, ErrInProgress)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// Issue 11, item 6: an error body that stalls costs its connection, not
// the retry, on the retry path and on the give-up path.
func TestStalledErrorBodyNeverHoldsUpARetry(t *testing.T) {
	stallBody := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "partial")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
	for _, tt := range []struct {
		name  string
		steps []step
		max   int
	}{
		{"retry", []step{stallBody, reply(200, "{}")}, 4},
		{"give up", []step{stallBody}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, tt.steps...)
			c := &Client{Policy: &Policy{MaxAttempts: tt.max, BaseDelay: time.Millisecond}}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			start := time.Now()
			resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
			if tt.max > 1 {
				require.NoError(t, err)
				resp.Body.Close()
			} else {
				assert.ErrorIs(t, err, ErrExhausted)
			}
			assert.Less(t, time.Since(start), time.Second)
		})
	}
}

// Issue 11, item 7: PrepareRequest gets copies of URL and Header, so the
// caller's request is never modified; a nil Header is handled.
func TestCallersRequestIsNeverModified(t *testing.T) {
	srv := newScripted(t, reply(200, "{}"))
	c := &Client{PrepareRequest: func(r *http.Request) error {
		q := r.URL.Query()
		q.Set("signed", "1")
		r.URL.RawQuery = q.Encode()
		r.Header.Set("X-Api-Key", "secret")
		if v := r.Header["X-Trace"]; len(v) > 0 {
			v[0] = "changed in place"
		}
		return nil
	}}
	req := post(t, srv.URL+"/charges?a=1", chargeBody)
	req.Header.Set("X-Trace", "t-1")
	wantURL := req.URL.String()
	wantHeader := req.Header.Clone()
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, wantURL, req.URL.String())
	assert.Equal(t, wantHeader, req.Header)
	require.Len(t, srv.Hits(), 1)
	assert.Equal(t, "secret", srv.Hits()[0].Header.Get("X-Api-Key"))

	// An unkeyed GET too: its header values are copied, not shared.
	get, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	get.Header.Set("X-Trace", "t-2")
	resp, err = c.Do(get)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "t-2", get.Header.Get("X-Trace"))

	nilHeader, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(chargeBody))
	require.NoError(t, err)
	nilHeader.Header = nil
	resp, err = c.Do(nilHeader)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Nil(t, nilHeader.Header)
}

// Issue 11, item 8: the budget engages in a brownout, not only in a full
// outage. Three of four attempts fail; with a success refunding every
// retry of its call the bucket never drained and each call cost 4
// attempts (1,200 in all); refunding only the retry that succeeded, as the
// AWS retry quota does, keeps it under 2 per call.
func TestBudgetEngagesInBrownout(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n.Add(1)%4 != 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	c := &Client{Policy: &Policy{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond, Budget: Budget{Capacity: 50}}}
	const calls = 300
	for range calls {
		resp, err := c.Do(post(t, srv.URL, chargeBody))
		if err == nil {
			resp.Body.Close()
		}
	}
	assert.LessOrEqual(t, int(n.Load()), 2*calls)
}

// bodyServer answers 503 to the first request and 200 to the rest, and
// records every body as it arrived, and whether it arrived whole (the
// read ended without an error: a length-framed body complete, a chunked
// one terminated, an HTTP/2 stream ended).
type bodyServer struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	whole  []bool
}

func newBodyServer(t *testing.T, h2 bool) *bodyServer {
	t.Helper()
	bs := &bodyServer{}
	bs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		bs.mu.Lock()
		n := len(bs.bodies)
		bs.bodies, bs.whole = append(bs.bodies, string(b)), append(bs.whole, err == nil)
		bs.mu.Unlock()
		if n == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	if h2 {
		bs.EnableHTTP2 = true
		bs.StartTLS()
	} else {
		bs.Start()
	}
	t.Cleanup(bs.Close)
	return bs
}

// wholeBodies returns the bodies that arrived whole.
func (bs *bodyServer) wholeBodies() []string {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	var out []string
	for i, b := range bs.bodies {
		if bs.whole[i] {
			out = append(out, b)
		}
	}
	return out
}

// Issue 22 §2.2: a GetBody that returns other bytes on a retry (a reused
// buffer, a file that changed) never gets a changed body completely
// delivered under the key, whatever its length (longer, shorter, the same)
// and however it is framed (HTTP/1.1 with a Content-Length, chunked,
// HTTP/2): byte n of the reference is held back, and more than n bytes
// fail at once. The call stops with ErrBodyChanged. The bodies are
// streamed (MaxBodyBytes below their size, or an unknown length), the
// path that trusts GetBody. Checked to fail with the length check removed
// from verifyingBody (more than n bytes let through): over HTTP/2 with a
// Content-Length the longer body's first n bytes arrived as a whole body.
func TestChangedBodyIsNeverSentUnderTheKey(t *testing.T) {
	others := map[string]string{
		"same length": `{"amount":9999,"currency":"usd"}`,
		"longer":      `{"amount":1000,"currency":"usd"}, "x":1}`,
		"shorter":     `{"amount":1000}`,
	}
	for _, h2 := range []bool{false, true} {
		for _, framing := range []string{"content-length", "unknown length"} {
			for name, other := range others {
				t.Run(fmt.Sprintf("h2=%v/%s/%s", h2, framing, name), func(t *testing.T) {
					srv := newBodyServer(t, h2)
					pol := fast()
					pol.MaxBodyBytes = 16 // stream it: no copy in memory
					c := &Client{Policy: pol, HTTPClient: srv.Client()}
					req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(chargeBody))
					require.NoError(t, err)
					req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(other)), nil }
					if framing == "unknown length" {
						req.ContentLength = -1
					}
					_, err = c.Do(req)
					var g *GiveUpError
					require.ErrorAs(t, err, &g)
					assert.ErrorIs(t, err, ErrBodyChanged)
					assert.NotEmpty(t, g.Key)
					assert.Equal(t, g.LastStatus != 0, g.Header != nil, "the last response's headers with its status, none without")
					assert.Equal(t, []string{chargeBody}, srv.wholeBodies(), "only the first body arrived whole")
				})
			}
		}
	}
}

// The caller swapped req.Body after NewRequest (same length, other bytes):
// every attempt carries the bytes of the body the first attempt sent, never
// GetBody's stale snapshot (issue 22 §2.2). Checked to fail with the old
// fast path, which trusted net/http's GetBody: the retry sent chargeBody.
func TestSwappedBodyIsResentAsSent(t *testing.T) {
	srv := newBodyServer(t, false)
	c := &Client{Policy: fast()}
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(chargeBody))
	require.NoError(t, err)
	swapped := `{"amount":7777,"currency":"usd"}`
	req.Body = io.NopCloser(strings.NewReader(swapped))
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{swapped, swapped}, srv.wholeBodies())
}

// Issue 11, item 9: a GetBody error on a retry is a *GiveUpError with the
// key and the attempts made (a streamed body: a small one is copied once
// and never asks GetBody).
func TestGetBodyErrorOnRetryIsAGiveUp(t *testing.T) {
	srv := newScripted(t, reply(503, ""), reply(200, "{}"))
	req := post(t, srv.URL, chargeBody)
	boom := errors.New("file gone")
	req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
	pol := fast()
	pol.MaxBodyBytes = 16
	c := &Client{Policy: pol}
	_, err := c.Do(req)
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	assert.ErrorIs(t, err, ErrNotReplayable)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, 1, g.Attempts)
	assert.Equal(t, srv.Hits()[0].Key, g.Key)
}

// Issue 11, item 10: errors that an identical retry would repeat are not
// retried: an invalid header value (refused before sending), a
// CheckRedirect refusal. (An unsupported scheme is no longer among them:
// net/http's refusal of it looks like a registered protocol's send, whose
// outcome is unknown; issue 31 §1.8, TestUnobservedSendIsNeverNotSent.)
func TestPermanentLocalErrorsAreNotRetried(t *testing.T) {
	srv := newScripted(t, reply(302, "", "Location", "/elsewhere"), reply(200, "{}"))
	refuse := errors.New("no redirects")
	tests := []struct {
		name string
		give func() *http.Request
		hc   *http.Client
	}{
		{"invalid header value", func() *http.Request {
			r := post(t, srv.URL, chargeBody)
			r.Header.Set("X-Bad", "a\nb")
			return r
		}, nil},
		{"CheckRedirect refusal", func() *http.Request { return post(t, srv.URL, chargeBody) },
			&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return refuse }}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var retries atomic.Int32
			c := &Client{Policy: fast(), HTTPClient: tt.hc, Hooks: &idemtrace.Hooks{OnRetry: func(context.Context, idemtrace.RetryEvent) { retries.Add(1) }}}
			resp, err := c.Do(tt.give())
			assert.Error(t, err)
			assert.Nil(t, resp)
			assert.Zero(t, retries.Load())
		})
	}
	assert.Len(t, srv.Hits(), 1, "the refused redirect was fetched once")
}

// Issue 11, item 11: a keyed request redirected to another host is not
// followed (the key, the body and PrepareRequest's headers stay home); a
// redirect that turns POST into GET drops the key.
func TestRedirectsNeverLeakTheKey(t *testing.T) {
	other := newScripted(t, reply(200, "{}"))
	t.Run("307 to another host", func(t *testing.T) {
		home := newScripted(t, reply(307, "", "Location", other.URL+"/steal"))
		c := &Client{PrepareRequest: func(r *http.Request) error { r.Header.Set("X-Api-Key", "sk"); return nil }}
		resp, err := c.Do(post(t, home.URL, chargeBody))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
		assert.Empty(t, other.Hits())
	})
	t.Run("unkeyed GET with PrepareRequest headers", func(t *testing.T) {
		home := newScripted(t, reply(302, "", "Location", other.URL+"/steal"))
		c := &Client{PrepareRequest: func(r *http.Request) error { r.Header.Set("X-Api-Key", "sk"); return nil }}
		req, _ := http.NewRequest(http.MethodGet, home.URL, nil)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusFound, resp.StatusCode)
		assert.Empty(t, other.Hits())
	})
	t.Run("303 on the same host", func(t *testing.T) {
		home := newScripted(t, reply(303, "", "Location", "/result"), reply(200, "{}"))
		var c Client
		resp, err := c.Do(post(t, home.URL, chargeBody))
		require.NoError(t, err)
		resp.Body.Close()
		hits := home.Hits()
		require.Len(t, hits, 2)
		assert.NotEmpty(t, hits[0].Key)
		assert.Equal(t, http.MethodGet, hits[1].Method)
		assert.Empty(t, hits[1].Header.Values("Idempotency-Key"))
	})
	t.Run("308 on the same host keeps key and body", func(t *testing.T) {
		home := newScripted(t, reply(308, "", "Location", "/v2"), reply(200, "{}"))
		var c Client
		resp, err := c.Do(post(t, home.URL, chargeBody))
		require.NoError(t, err)
		resp.Body.Close()
		hits := home.Hits()
		require.Len(t, hits, 2)
		assert.Equal(t, hits[0].Key, hits[1].Key)
		assert.Equal(t, chargeBody, hits[1].Body)
	})
	assert.Empty(t, other.Hits())
}

// Issue 11, item 12: secret query values stay out of errors and logs, and
// out of the journal.
func TestSecretQueryValuesAreRedacted(t *testing.T) {
	srv := newScripted(t, reply(503, ""))
	var logs bytes.Buffer
	c := &Client{
		Policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, RedactQuery: []string{"Partner_Sig"}},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	}
	_, err := c.Do(post(t, srv.URL+"/v1?api_key=sk_live_123&partner_sig=ps_9&page=2", chargeBody))
	require.Error(t, err)
	for _, s := range []string{err.Error(), logs.String()} {
		assert.NotContains(t, s, "sk_live_123")
		assert.NotContains(t, s, "ps_9")
		assert.Contains(t, s, "api_key=REDACTED")
		assert.Contains(t, s, "page=2")
	}

	journaled := &Client{Policy: unnamed(nil), Journal: newRecJournal()}
	_, err = journaled.Do(post(t, srv.URL+"/v1?access_token=t0k", chargeBody))
	assert.ErrorIs(t, err, ErrInvalidRequest)
	assert.Len(t, srv.Hits(), 2, "the journaled request was refused before sending")
}

// Issue 11, item 13: the configuration is read once; a caller who changes
// its Policy or Client fields later neither races with calls in flight nor
// changes what they do.
func TestConfigurationIsSnapshotted(t *testing.T) {
	srv := newScripted(t, reply(200, "{}"))
	p := &Policy{KeyMethods: []string{http.MethodPost}}
	c := &Client{Policy: p}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range 50 {
			p.KeyMethods[0] = http.MethodGet
			p.MaxAttempts = 9
			c.Logger = slog.Default()
			c.Hooks = &idemtrace.Hooks{OnRetry: func(context.Context, idemtrace.RetryEvent) {}}
			c.SecretHeaders = []string{"X"}
		}
	}()
	go func() {
		defer wg.Done()
		for range 50 {
			resp, err := c.Do(post(t, srv.URL, chargeBody))
			if err == nil {
				resp.Body.Close()
			}
		}
	}()
	wg.Wait()
	for _, h := range srv.Hits() {
		assert.NotEmpty(t, h.Key, "POST stays keyed")
	}
}

// Issue 11, item 15: the in-memory operation map forgets done entries
// past the retention, so a long-lived Client stays bounded; a pending one
// past it stays, abandoned and without its body, so that a rerun is
// refused (TestAttackMemoryJournalNeverForgetsAnOperationThatMayHaveRun).
func TestMemJournalForgetsPastRetention(t *testing.T) {
	m := newMemJournal(time.Hour)
	ctx := context.Background()
	old := time.Now().Add(-2 * time.Hour)
	_, err := m.Begin(ctx, &Entry{Key: "old-pending", Operation: "op-old", Created: old, Updated: old, State: StatePending, Body: []byte("body")})
	require.NoError(t, err)
	_, err = m.Begin(ctx, &Entry{Key: "old-done", Operation: "op-done", Created: old, Updated: old, State: StatePending})
	require.NoError(t, err)
	require.NoError(t, m.Finish(ctx, "old-done", Outcome{State: StateDone, Status: 201, At: old}))
	for i := range memPruneEvery - 1 {
		now := time.Now()
		_, err := m.Begin(ctx, &Entry{Key: fmt.Sprint("k", i), Created: now, Updated: now, State: StatePending})
		require.NoError(t, err)
	}
	_, err = m.Get(ctx, "old-done")
	assert.ErrorIs(t, err, ErrNotFound, "done past the retention: forgotten")
	e, err := m.Get(ctx, "old-pending")
	require.NoError(t, err, "pending past the retention: kept")
	assert.Equal(t, StateAbandoned, e.State)
	assert.Nil(t, e.Body, "without its body")
	m.mu.Lock()
	defer m.mu.Unlock()
	assert.NotContains(t, m.byOp, "op-done")
	assert.Contains(t, m.byOp, "op-old")
	assert.Len(t, m.byKey, memPruneEvery)
}

// Issue 11, item 16: a retried DELETE that meets 404 after an attempt whose
// outcome was unknown: ResponseInfo says so, and the policy option reports
// it as the success it most likely was.
func TestRetriedDeleteNotFound(t *testing.T) {
	for _, ok := range []bool{false, true} {
		t.Run(fmt.Sprint("RetriedDeleteNotFoundOK=", ok), func(t *testing.T) {
			srv := newScripted(t, drop, reply(404, `{"error":"no such charge"}`))
			c := &Client{Policy: &Policy{BaseDelay: time.Millisecond, RetriedDeleteNotFoundOK: ok}}
			req, _ := http.NewRequest(http.MethodDelete, srv.URL+"/charges/ch_1", nil)
			resp, err := c.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			info, _ := ResponseInfo(resp)
			assert.True(t, info.UnknownOutcome)
			if ok {
				assert.Equal(t, http.StatusNoContent, resp.StatusCode)
				assert.Equal(t, http.StatusNotFound, info.OriginalStatus)
			} else {
				assert.Equal(t, http.StatusNotFound, resp.StatusCode)
				assert.Zero(t, info.OriginalStatus)
			}
		})
	}
	// Without an unknown attempt, a 404 is a 404.
	srv := newScripted(t, reply(404, ""))
	c := &Client{Policy: &Policy{RetriedDeleteNotFoundOK: true}}
	req, _ := http.NewRequest(http.MethodDelete, srv.URL, nil)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// Issue 15, item 4: under WithOperation with a journal, the journal's key
// wins over a key an SDK set in the header on a later run.
func TestJournalKeyWinsOverHeaderKey(t *testing.T) {
	srv := newScripted(t, drop, reply(200, "{}"))
	j := newRecJournal()
	c := &Client{Journal: j, Policy: unnamed(&Policy{MaxAttempts: 1})}
	ctx := WithOperation(context.Background(), "row-1")
	req := post(t, srv.URL, chargeBody).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "sdk-minted-1")
	_, err := c.Do(req)
	require.Error(t, err) // the response was lost: the entry stays pending

	req = post(t, srv.URL, chargeBody).WithContext(ctx)
	req.Header.Set("Idempotency-Key", "sdk-minted-2")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	hits := srv.Hits()
	require.Len(t, hits, 2)
	assert.Equal(t, "sdk-minted-1", hits[1].Key, "the rerun sends the operation's key")

	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithKey(ctx, "explicit-other")))
	assert.ErrorIs(t, err, ErrKeyConflict, "a key given with WithKey is the caller's word")
}

// setRaw writes a header under a name exactly as given, as a map write
// from configuration would, without canonicalising it.
func setRaw(h http.Header, name string, v []string) { h[name] = v }

// FuzzVerifyingBody: read in any chunk sizes, a body that matches the
// reference comes out byte for byte; one that differs (longer, shorter or
// of the same length) never comes out whole: what comes out is a prefix
// of it shorter than the reference, since byte n of the reference is held
// back and more than n bytes fail at once (issue 22 §2.2). Checked to
// fail with the old rule (hold back the last byte read): a longer body
// delivered the reference's n bytes.
func FuzzVerifyingBody(f *testing.F) {
	f.Add([]byte(`{"amount":1000}`), []byte(`{"amount":1000}`), uint8(3))
	f.Add([]byte(`{"amount":1000}`), []byte(`{"amount":9999}`), uint8(1))
	f.Add([]byte(`{"amount":1000}`), []byte(`{"amount":1000,"x":1}`), uint8(15))
	f.Add([]byte(`{"amount":1000}`), []byte(`{"amount":10}`), uint8(2))
	f.Add([]byte("a"), []byte("b"), uint8(0))
	f.Add([]byte(""), []byte("x"), uint8(7))
	f.Fuzz(func(t *testing.T, ref, body []byte, chunk uint8) {
		var r bodyRef
		var first verifyingBody
		declared := int64(len(ref)) // a Content-Length, or none (chunked) when even
		if chunk%2 == 0 {
			declared = 0
		}
		first.reset(context.Background(), io.NopCloser(bytes.NewReader(ref)), &r, declared, false)
		if got, err := io.ReadAll(&first); err != nil || !bytes.Equal(got, ref) {
			t.Fatalf("the reference reads back as %q, %v", got, err)
		}
		var v verifyingBody
		v.reset(context.Background(), io.NopCloser(iotest.OneByteReader(bytes.NewReader(body))), &r, declared, true)
		var out []byte
		buf := make([]byte, int(chunk%16)+1)
		var err error
		for {
			var k int
			k, err = v.Read(buf)
			out = append(out, buf[:k]...)
			if err != nil {
				break
			}
		}
		if bytes.Equal(ref, body) {
			if err != io.EOF || !bytes.Equal(out, body) {
				t.Fatalf("matching body: got %q, %v", out, err)
			}
			return
		}
		if !errors.Is(err, ErrBodyChanged) || !bytes.HasPrefix(body, out) || len(out) >= max(len(ref), 1) {
			t.Fatalf("changed body %q (reference %q): got %q, %v", body, ref, out, err)
		}
		if !r.differed() {
			t.Fatal("the change is not recorded")
		}
	})
}

// Issue 11, item 4: net/http resends a request that carries an
// Idempotency-Key by itself when a reused connection breaks after the
// request was written, so the server may have seen a freshly minted key
// before the client's first attempt ends. The trace counts that resend,
// and the 409 that follows is then read as "in progress", not as the
// application's own conflict.
func TestSilentResendMakesAKeyUsed(t *testing.T) {
	inProgress := `{"type":"https://developer.example.com/idempotency","title":"A request is outstanding for this Idempotency-Key"}`
	srv := newScripted(t, reply(200, "{}"), drop, reply(409, inProgress), reply(200, "{}", "Idempotent-Replayed", "true"))
	c := &Client{Policy: fast()}
	warm, _ := http.NewRequest(http.MethodGet, srv.URL+"/warm", nil)
	resp, err := c.Do(warm) // leaves a pooled connection for the POST to reuse
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	resp, err = c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	defer resp.Body.Close()
	hits := srv.Hits()
	require.Len(t, hits, 4, "the POST was sent three times: net/http's resend, then one retry")
	assert.Equal(t, hits[1].Key, hits[2].Key)
	assert.Equal(t, hits[1].Key, hits[3].Key)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	info, _ := ResponseInfo(resp)
	assert.Equal(t, 2, info.Attempts, "net/http's own resend is not an attempt")
	assert.True(t, info.Replayed)
}

// Issue 22 §2.11: a Retry-After of 0, or a date in the past, on 429 and
// 503 gets at least the policy's backoff, as a 409's does: an overloaded
// server that says "now" to every client must not get a retry storm. The
// delay decided is read from the retry event, not timed. Checked to fail
// with the floor removed from retry (the delay was 0).
func TestRetryAfterZeroGetsTheBackoff(t *testing.T) {
	past := time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)
	for _, tt := range []struct {
		status int
		after  string
	}{{429, "0"}, {503, "0"}, {429, past}, {503, past}} {
		t.Run(fmt.Sprintf("%d %s", tt.status, tt.after), func(t *testing.T) {
			srv := newScripted(t, reply(tt.status, "", "Retry-After", tt.after), reply(200, "{}"))
			var delays []time.Duration
			c := &Client{Policy: &Policy{BaseDelay: 4 * time.Millisecond, MaxDelay: 4 * time.Millisecond},
				Hooks: &idemtrace.Hooks{OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) { delays = append(delays, ev.Delay) }}}
			resp, err := c.Do(post(t, srv.URL, chargeBody))
			require.NoError(t, err)
			resp.Body.Close()
			require.Len(t, delays, 1)
			assert.GreaterOrEqual(t, delays[0], 2*time.Millisecond, "the backoff (4 ms, jitter ±50%) is the floor")
		})
	}
}

// Issue 26 §7: Policy.Backoff replaces the exponential backoff, for every
// retry (an in-progress wait too); a longer Retry-After still wins.
// Checked to fail with backoff() ignoring Policy.Backoff.
func TestPolicyBackoff(t *testing.T) {
	srv := newScripted(t, reply(503, ""), reply(409, ""), reply(503, "", "Retry-After", "1"), reply(200, "{}"))
	var retries []int
	var delays []time.Duration
	c := &Client{
		Policy: &Policy{Backoff: func(n int) time.Duration {
			retries = append(retries, n)
			return time.Duration(n) * time.Millisecond
		}, MaxRetryAfter: 2 * time.Second},
		Hooks: &idemtrace.Hooks{OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) { delays = append(delays, ev.Delay) }},
	}
	req := post(t, srv.URL, chargeBody)
	req.Header.Set("Idempotency-Key", "caller-key-b")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []int{1, 2, 3}, retries)
	assert.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond, time.Second}, delays)
}

// recPacer records what the client tells its Pacer.
type recPacer struct {
	mu       sync.Mutex
	waits    int
	observed []string
}

func (p *recPacer) Wait(context.Context) error {
	p.mu.Lock()
	p.waits++
	p.mu.Unlock()
	return nil
}

func (p *recPacer) Observe(status int, throttled bool) {
	p.mu.Lock()
	p.observed = append(p.observed, fmt.Sprintf("%d/%v", status, throttled))
	p.mu.Unlock()
}

// Policy.Pacer waits before every attempt and hears every outcome, with
// the throttles (429, 503 with Retry-After) marked. Checked to fail with
// the pacer's Wait left out of engineRequestHook.
func TestPolicyPacer(t *testing.T) {
	srv := newScripted(t, reply(429, ""), reply(503, "", "Retry-After", "0"), reply(503, ""), reply(200, "{}"))
	p := &recPacer{}
	c := &Client{Policy: &Policy{Pacer: p, BaseDelay: time.Millisecond, MaxAttempts: 5}}
	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 4, p.waits)
	assert.Equal(t, []string{"429/true", "503/true", "503/false", "200/false"}, p.observed)
}
