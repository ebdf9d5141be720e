package idemhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// apiError is a final answer an API explains in its body and headers.
func apiError(status int, body string) step {
	return reply(status, body,
		"Content-Type", "application/json",
		"Request-Id", "req_1",
		"X-Ratelimit-Remaining", "0",
		"Set-Cookie", "session=COOKIE_SECRET; HttpOnly",
		"X-Api-Key", "ECHOED_SECRET",
		"Location", "https://files.example.com/e/1?X-Amz-Signature=SIG_SECRET&v=1",
	)
}

// TestGiveUpErrorCarriesLastResponse (issue 34 §3): a call that gives up
// on a final status returns the last response's status, headers and body
// in its *GiveUpError, read before Do returned, with no credential: no
// cookie, no header the caller named secret, no URL signature. Checked
// to fail with giveUpJoin setting neither Header nor Body, and with
// contract.ErrorHeader keeping Set-Cookie.
func TestGiveUpErrorCarriesLastResponse(t *testing.T) {
	const body = `{"error":{"type":"api_error","message":"try later"}}`
	srv := newScripted(t, apiError(503, body))
	c := &Client{Policy: fast(), SecretHeaders: []string{"X-Api-Key"}}
	c.Policy.MaxAttempts = 2

	resp, err := c.Do(post(t, srv.URL, `{}`))

	require.Nil(t, resp)
	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	assert.ErrorIs(t, err, ErrExhausted)
	assert.Equal(t, 503, g.LastStatus)
	assert.Equal(t, body, string(g.Body))
	assert.False(t, g.BodyTruncated)
	assert.Equal(t, "application/json", g.Header.Get("Content-Type"))
	assert.Equal(t, "req_1", g.Header.Get("Request-Id"))
	assert.Equal(t, "0", g.Header.Get("X-Ratelimit-Remaining"), "an API's own headers are kept")
	assert.Equal(t, "https://files.example.com/e/1?X-Amz-Signature=REDACTED&v=1", g.Header.Get("Location"))
	for name, vals := range g.Header {
		for _, v := range vals {
			assert.NotContains(t, v, "SECRET", name)
		}
	}
	assert.Empty(t, g.Header.Values("Set-Cookie"))
	assert.Empty(t, g.Header.Values("X-Api-Key"))
}

// TestGiveUpErrorBodyBounded: the error keeps the first 64 KiB of a
// longer body and says it is cut; a body of exactly 64 KiB is whole.
// Checked to fail with errorBodyOf not cutting.
func TestGiveUpErrorBodyBounded(t *testing.T) {
	tests := []struct {
		name    string
		giveLen int
		wantLen int
		wantCut bool
	}{
		{"empty", 0, 0, false},
		{"small", 100, 100, false},
		{"exactly the bound", errorBodyLen, errorBodyLen, false},
		{"longer", errorBodyLen + 1000, errorBodyLen, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, reply(503, strings.Repeat("x", tt.giveLen)))
			c := &Client{Policy: fast()}
			c.Policy.MaxAttempts = 1

			_, err := c.Do(post(t, srv.URL, `{}`))

			var g *GiveUpError
			require.ErrorAs(t, err, &g)
			assert.Len(t, g.Body, tt.wantLen)
			assert.Equal(t, tt.wantCut, g.BodyTruncated)
		})
	}
}

// TestGiveUpErrorDuringWait: a call whose context ends while it waits to
// retry after a response still reports that response: its status, and
// its headers and body too, which the wait read before it drained them.
// Checked to fail with giveUpJoin ignoring what wait kept.
func TestGiveUpErrorDuringWait(t *testing.T) {
	srv := newScripted(t, apiError(503, `{"error":"busy"}`), reply(200, ""))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := &Client{Policy: &Policy{BaseDelay: time.Hour, MaxDelay: time.Hour}}
	c.Hooks = &idemtrace.Hooks{OnRetry: func(context.Context, idemtrace.RetryEvent) { cancel() }}
	req := post(t, srv.URL, `{}`).WithContext(ctx)

	_, err := c.Do(req)

	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 503, g.LastStatus)
	assert.Equal(t, `{"error":"busy"}`, string(g.Body))
	assert.Equal(t, "req_1", g.Header.Get("Request-Id"))
	assert.Empty(t, g.Header.Values("Set-Cookie"))
	assert.Len(t, srv.Hits(), 1)
}

// TestGiveUpErrorNoResponse: a give-up after an attempt that got no
// answer carries no header or body, even when an earlier attempt got one:
// they belong to LastStatus, which is 0.
func TestGiveUpErrorNoResponse(t *testing.T) {
	srv := newScripted(t, apiError(503, `{"error":"busy"}`), drop)
	c := &Client{Policy: fast()}
	c.Policy.MaxAttempts = 2

	_, err := c.Do(post(t, srv.URL, `{}`))

	var g *GiveUpError
	require.ErrorAs(t, err, &g)
	assert.Zero(t, g.LastStatus)
	assert.Nil(t, g.Header)
	assert.Nil(t, g.Body)
}

// TestGiveUpErrorThroughStandardClient: an SDK gets the last response
// whole, and the error ResponseInfo carries has read the same body
// without taking it from the SDK.
func TestGiveUpErrorThroughStandardClient(t *testing.T) {
	const body = `{"error":{"message":"try later"}}`
	srv := newScripted(t, apiError(503, body))
	c := &Client{Policy: fast()}
	c.Policy.MaxAttempts = 2

	resp, err := c.StandardClient().Do(post(t, srv.URL, `{}`))

	require.NoError(t, err)
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, body, string(got), "the SDK reads the whole body")
	info, ok := ResponseInfo(resp)
	require.True(t, ok)
	var g *GiveUpError
	require.True(t, errors.As(info.Err, &g))
	assert.Equal(t, body, string(g.Body))
	assert.Equal(t, "req_1", g.Header.Get("Request-Id"))
	assert.Empty(t, g.Header.Values("Set-Cookie"))
}

// TestInvalidOperationID (issue 34 §6): WithOperation("") is refused as an
// invalid operation id, never as an invalid idempotency key (the caller
// set no key). Checked to fail with ValidateOperation wrapping
// ValidateKey's error as it did.
func TestInvalidOperationID(t *testing.T) {
	srv := newScripted(t, reply(200, ""))
	for _, op := range []string{"", "tab\there", strings.Repeat("o", 256)} {
		var c Client
		req := post(t, srv.URL, `{}`).WithContext(WithOperation(context.Background(), op))

		_, err := c.Do(req)

		require.ErrorIs(t, err, ErrInvalidRequest, "%q", op)
		assert.NotErrorIs(t, err, ErrInvalidKey, "%q", op)
		assert.Contains(t, err.Error(), "operation id", "%q", op)
		assert.NotContains(t, err.Error(), "idempotency key", "%q", op)
	}
	assert.Empty(t, srv.Hits())
}

// TestKeyMismatchSaysWhatDiffered (issue 31 §16): an operation rerun with
// another request is refused locally, and the error names what differs
// (method, origin, path, query, body) and shows both sides, with the
// URLs redacted: a rerun after a change of base URL is understood at
// once. Checked to fail with begin returning a KeyMismatchError without
// Differs (as it did), and with redactedPath showing the raw path.
func TestKeyMismatchSaysWhatDiffered(t *testing.T) {
	srv := newScripted(t, reply(200, `{"id":"ch_1"}`))
	other := "http://127.0.0.1:1" // never reached: the refusal is local
	tests := []struct {
		name        string
		giveMethod  string
		giveURL     string
		giveBody    string
		wantDiffers []string
		wantMsg     []string
	}{
		{"base URL", "POST", other + "/hooks/T0/first?v=1", `{"amount":1000}`, []string{"origin"},
			[]string{"origin " + srv.URL + " in the journal, " + other + " now"}},
		{"path", "POST", srv.URL + "/hooks/T0/second?v=1", `{"amount":1000}`, []string{"path"},
			[]string{`path "/hooks/REDACTED" in the journal, "/hooks/REDACTED" now`}},
		{"query", "POST", srv.URL + "/hooks/T0/first?v=2", `{"amount":1000}`, []string{"query"},
			[]string{`query "v=1" in the journal, "v=2" now`}},
		{"method", "PATCH", srv.URL + "/hooks/T0/first?v=1", `{"amount":1000}`, []string{"method"},
			[]string{"method POST in the journal, PATCH now"}},
		{"body", "POST", srv.URL + "/hooks/T0/first?v=1", `{"amount":10000}`, []string{"body"},
			[]string{"body of 15 bytes in the journal, 16 now"}},
		{"body, same length", "POST", srv.URL + "/hooks/T0/first?v=1", `{"amount":2000}`, []string{"body"},
			[]string{"body of 15 bytes in both, other bytes"}},
		{"everything", "PUT", other + "/v2?v=3", `{}`, []string{"method", "origin", "path", "query", "body"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{Journal: newMemJournal(time.Hour), Policy: &Policy{RedactPathAfter: []string{"/hooks/"}}}
			ctx := WithOperation(context.Background(), "charge-1")
			first, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/hooks/T0/first?v=1", strings.NewReader(`{"amount":1000}`))
			require.NoError(t, err)
			resp, err := c.Do(first)
			require.NoError(t, err)
			resp.Body.Close()
			rerun, err := http.NewRequestWithContext(ctx, tt.giveMethod, tt.giveURL, strings.NewReader(tt.giveBody))
			require.NoError(t, err)

			_, err = c.Do(rerun)

			var m *KeyMismatchError
			require.ErrorAs(t, err, &m)
			assert.Equal(t, tt.wantDiffers, m.Differs)
			assert.Equal(t, "POST "+srv.URL+"/hooks/REDACTED?v=1", m.Journaled)
			assert.Contains(t, m.Request, tt.giveMethod+" ")
			for _, want := range tt.wantMsg {
				assert.Contains(t, err.Error(), want)
			}
			assert.NotContains(t, err.Error(), "T0", "the path's secret")
			assert.Contains(t, err.Error(), `operation "charge-1"`)
		})
	}
}

// TestKeyMismatchWithoutJournaledBody: a journal that keeps no body still
// tells a changed body from the fingerprint, and an unchanged one is not
// named.
func TestKeyMismatchWithoutJournaledBody(t *testing.T) {
	const url = "https://api.example.com/v1/charges"
	j := &Entry{Operation: "op", Key: "k", Method: "POST", URL: url, Fingerprint: contract.Fingerprint("POST", url, []byte(`{"a":1}`))}

	m := localMismatch(j, "POST", url, []byte(`{"a":2}`), nil, nil)
	assert.Equal(t, []string{"body"}, m.Differs)
	assert.Contains(t, m.Error(), "body differs (the journal keeps no body: 7 bytes now)")

	m = localMismatch(j, "POST", "https://api.example.com/v2/charges", []byte(`{"a":1}`), nil, nil)
	assert.Equal(t, []string{"path"}, m.Differs, "the body is the same")

	m = localMismatch(j, "POST", url, []byte(`{"a":1}`), nil, nil)
	assert.Empty(t, m.Differs, "a fingerprint of another rule: nothing to name")
	assert.Equal(t, `idemhttp: idempotency key reused with a different request: operation "op" (key k) was started with a different request`, m.Error())
}
