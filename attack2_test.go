package idemhttp

// Issue 31 §3 and issue 33 target 1: a second helper with fresh eyes
// attacked the client's new fast path (send.go, body.go) and what it
// touches. Each test here pins one thing it found, and is named after it.

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtrace"
)

// setCookiesPanicJar panics in SetCookies, which runs once the answer is
// in: the request has reached the server by then.
type setCookiesPanicJar struct{ p *panicOnce }

func (setCookiesPanicJar) Cookies(*url.URL) []*http.Cookie       { return nil }
func (j setCookiesPanicJar) SetCookies(*url.URL, []*http.Cookie) { j.p.boom() }

// A panic that comes after the attempt was handed to the transport (the
// caller's CheckRedirect on a POST's 303, the caller's RoundTripper once
// its inner transport has the answer, the Jar storing the answer's
// cookies, the Pacer observing the answer) left the call "never sent":
// the attempt's wire evidence was read only by checkRetry, which the
// panic skipped, so unwind withdrew the entry of an operation the server
// had run, and the rerun the caller makes after recovering minted a new
// key and ran it twice. Checked to fail with unwind not reading the
// interrupted attempt's wire evidence (the entry was withdrawn and the
// rerun sent a second key, in every case, both ways).
func TestAttackPanicAfterTheWireKeepsTheEntry(t *testing.T) {
	tests := []struct {
		name  string
		first step // the server's answer to the panicking call
		setup func(c *Client, p *panicOnce)
	}{
		{"CheckRedirect on a 303", reply(http.StatusSeeOther, "", "Location", "/charges/ch_1"), func(c *Client, p *panicOnce) {
			c.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { p.boom(); return nil }}
		}},
		{"RoundTripper after the answer", reply(http.StatusCreated, `{"id":"ch_1"}`), func(c *Client, p *panicOnce) {
			c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil {
					defer resp.Body.Close()
				}
				p.boom()
				return resp, err
			})}
		}},
		{"Jar.SetCookies", reply(http.StatusCreated, `{"id":"ch_1"}`, "Set-Cookie", "s=1"), func(c *Client, p *panicOnce) {
			c.HTTPClient = &http.Client{Jar: setCookiesPanicJar{p}}
		}},
		{"Pacer.Observe", reply(http.StatusCreated, `{"id":"ch_1"}`), func(c *Client, p *panicOnce) {
			c.Policy.Pacer = pacerFunc{observe: func(int, bool) { p.boom() }}
		}},
	}
	for _, tt := range tests {
		for _, engineFirst := range []bool{false, true} {
			name := tt.name
			if engineFirst {
				name += " engine first"
			}
			t.Run(name, func(t *testing.T) {
				srv := newScripted(t, tt.first, reply(http.StatusOK, `{"id":"ch_1"}`))
				rec := newRecJournal()
				p := &panicOnce{}
				c := &Client{Policy: fast(), Journal: rec}
				tt.setup(c, p)
				c.init()
				c.cfg.engineFirst = engineFirst
				ctx := WithOperation(context.Background(), "op-panic-wire")
				got := func() (v any) {
					defer func() { v = recover() }()
					resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
					if err == nil {
						resp.Body.Close()
					}
					return nil
				}()
				require.Equal(t, errPanicHook, got, "the panic goes on to the caller")
				require.NotEmpty(t, srv.Hits(), "the request reached the server")

				e, err := rec.Lookup(ctx, "op-panic-wire")
				require.NoError(t, err, "the entry of an operation the server may have run is kept")
				assert.Equal(t, StatePending, e.State)

				// The caller's rerun after recovering: same key, never a new one.
				resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
				if err == nil {
					resp.Body.Close()
				}
				keys := map[string]bool{}
				for _, h := range srv.Hits() {
					if h.Method == http.MethodPost {
						keys[h.Key] = true
					}
				}
				assert.Len(t, keys, 1, "one key for one operation")
			})
		}
	}
}

// A RoundTripper that returns neither a response nor an error is an
// error for net/http's Client, and for the client without a Jar (send.go
// says so as http.Client does); with a Jar, attemptTransport stored the
// nil response's cookies and panicked with a nil dereference, both ways.
// Checked to fail with the Jar's SetCookies called on a nil response.
func TestAttackJarWithNilResponseIsAnErrorNotAPanic(t *testing.T) {
	for _, engineFirst := range []bool{false, true} {
		jar, err := cookiejar.New(nil)
		require.NoError(t, err)
		rec := newRecJournal()
		c := &Client{Policy: fast(), Journal: rec, HTTPClient: &http.Client{Jar: jar,
			Transport: roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil })}}
		c.init()
		c.cfg.engineFirst = engineFirst
		ctx := WithOperation(context.Background(), "op-nil-resp")
		var resp *http.Response
		require.NotPanics(t, func() { resp, err = c.Do(post(t, "http://127.0.0.1:1/charges", chargeBody).WithContext(ctx)) })
		require.Error(t, err)
		assert.Nil(t, resp)
		assert.Contains(t, err.Error(), "nil *Response with a nil error")
		e, lerr := rec.Lookup(ctx, "op-nil-resp")
		require.NoError(t, lerr, "a RoundTripper nobody can observe may have sent it")
		assert.Equal(t, StatePending, e.State)
	}
}

// hostKeyTransport adds an API key to the requests for its own host, in
// place, as many hand-written RoundTrippers do (the RoundTripper contract
// forbids it; net/http's Client copes, as it snapshots a request's header
// before its first hop).
type hostKeyTransport struct{ host string }

func (t hostKeyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host == t.host {
		r.Header.Set("X-Api-Key", "sk_live_secret")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// The direct first attempt handed a redirect to http.Client only after
// the caller's RoundTripper had sent the first hop, so http.Client
// copied the header the RoundTripper had changed in place onto the next
// hop: a RoundTripper that adds an API key for its own host only leaked
// it to the host a redirect named (and one that Adds a header sent it
// twice). Through the engine, as before send.go, http.Client copies the
// header as the caller made it. Checked to fail with send handing every
// RoundTripper's redirect to http.Client after the first hop (the other
// origin got X-Api-Key).
func TestAttackRedirectCarriesNoHeaderTheTransportAddedInPlace(t *testing.T) {
	for _, engineFirst := range []bool{false, true} {
		other := newScripted(t, reply(http.StatusOK, "elsewhere"))
		srv := newScripted(t, reply(http.StatusFound, "", "Location", other.URL+"/landing"))
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		c := &Client{Policy: fast(), HTTPClient: &http.Client{Transport: hostKeyTransport{host: u.Host}}}
		c.init()
		c.cfg.engineFirst = engineFirst
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/report", nil)
		require.NoError(t, err)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Len(t, srv.Hits(), 1)
		assert.Equal(t, "sk_live_secret", srv.Hits()[0].Header.Get("X-Api-Key"))
		require.Len(t, other.Hits(), 1, "an unkeyed GET follows the redirect")
		assert.Empty(t, other.Hits()[0].Header.Get("X-Api-Key"), "engine first %v: the key the transport adds for its own host reached another", engineFirst)
	}
}

// A call that panics before its streamed body (GetBody, a length unknown
// or above MaxBodyBytes) was handed to the transport never closes that
// body: net/http closes a request's body on every path, the client on
// every path but a panic's (in OnCallStart, PrepareRequest, OnAttempt,
// Pacer.Wait), so a caller streaming through an io.Pipe, who recovers
// the panic, has its writer goroutine blocked for good. Both ways alike,
// and so in the previous release.
func TestAttackPanicBeforeSendingClosesAStreamedBody(t *testing.T) {
	// Checked to fail with proceed's deferred close removed (every case
	// blocked 5 s), and with only its stream branch (PrepareRequest's and
	// OnCallStart's, before the stream is set up).
	for _, where := range []string{"OnAttempt", "PrepareRequest", "OnCallStart"} {
		t.Run(where, func(t *testing.T) {
			srv := newScripted(t, reply(http.StatusCreated, "{}"))
			pr, pw := io.Pipe()
			closed := make(chan struct{})
			go func() {
				if _, err := pw.Write(make([]byte, 10)); err != nil {
					close(closed)
				}
			}()
			req, err := http.NewRequest(http.MethodPost, srv.URL, pr)
			require.NoError(t, err)
			req.GetBody = func() (io.ReadCloser, error) { return http.NoBody, nil }
			p := &panicOnce{}
			c := &Client{Policy: fast(), Hooks: &idemtrace.Hooks{}}
			switch where {
			case "OnAttempt":
				c.Hooks.OnAttempt = func(context.Context, idemtrace.AttemptEvent) { p.boom() }
			case "PrepareRequest":
				c.PrepareRequest = func(*http.Request) error { p.boom(); return nil }
			case "OnCallStart":
				c.Hooks.OnCallStart = func(context.Context, idemtrace.CallEvent) context.Context { p.boom(); return nil }
			}
			func() {
				defer func() { _ = recover() }()
				resp, err := c.Do(req)
				if err == nil {
					resp.Body.Close()
				}
			}()
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				_ = pr.Close()
				t.Fatal("the request body was never closed: its writer is blocked")
			}
		})
	}
}
