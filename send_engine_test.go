package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtrace"
)

// transcript is what a caller, its hooks, the server and the journal saw
// of one call, keys written as K and the server as SRV (both change).
type transcript struct {
	mu    sync.Mutex
	key   string
	lines []string
}

func (tr *transcript) add(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, fmt.Sprintf(format, args...))
}

func (tr *transcript) errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// hooks records every event with the fields that do not depend on time.
func (tr *transcript) hooks() *idemtrace.Hooks {
	return &idemtrace.Hooks{
		OnAttempt: func(_ context.Context, ev idemtrace.AttemptEvent) {
			tr.add("attempt %d %s %s op=%q", ev.Attempt, ev.Method, ev.URL, ev.Operation)
		},
		OnAttemptDone: func(_ context.Context, ev idemtrace.AttemptDoneEvent) {
			tr.add("attempt done %d status=%d class=%q err=%s", ev.Attempt, ev.Status, ev.Class, tr.errString(ev.Err))
		},
		OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) {
			tr.add("retry %d reason=%s status=%d err=%s", ev.Attempt, ev.Reason, ev.Status, tr.errString(ev.Err))
		},
		OnGiveUp: func(_ context.Context, ev idemtrace.GiveUpEvent) {
			tr.add("give up %s", tr.errString(ev.Err))
		},
		OnCallDone: func(_ context.Context, ev idemtrace.CallDoneEvent) {
			tr.mu.Lock()
			tr.key = cmpOr(tr.key, ev.Key)
			tr.mu.Unlock()
			tr.add("call done attempts=%d status=%d replayed=%v err=%s", ev.Attempts, ev.Status, ev.Replayed, tr.errString(ev.Err))
		},
		OnJournal: func(_ context.Context, ev idemtrace.JournalEvent) {
			tr.add("journal %s state=%s existing=%v err=%s", ev.Op, ev.State, ev.Existing, tr.errString(ev.Err))
		},
	}
}

// engineCase is one call TestFirstAttemptMatchesEngine makes both ways.
type engineCase struct {
	name    string
	steps   []step
	op      string // the call's operation ("" for none)
	streamN int    // a streamed body of this many bytes (GetBody, unknown length), 0 for a string
	sdk     bool   // through StandardClient, as an SDK calls
	setup   func(c *Client, p *panicOnce)
}

// Issue 33 target 1: the first attempt goes out directly (send.go), and
// a retry hands the call to go-retryablehttp's engine. Every call below
// runs twice, once so and once with the engine sending the first attempt
// too (config.engineFirst, as every attempt went before), and what the
// caller gets (response, error, panic, ResponseInfo), what the hooks
// report, what the server receives and what the journal keeps must be
// the same. The cases are the lifecycle's decisions around an attempt:
// evidence of sending (refused connections: not sent; a dropped
// connection: maybe), redirects followed and refused (another origin
// with a key; the caller's CheckRedirect), PrepareRequest (and its
// refused key change), hooks, a Pacer's refusal, a Retry-After that parks
// the operation, panics in a hook, the transport and CheckRedirect,
// streamed bodies with retries. Checked to fail with each of: run not
// calling engineRequestHook before the first attempt (no OnAttempt 1);
// send returning a 3xx instead of handing it to http.Client (the
// same-origin redirect is not followed); run returning a give-up without
// engineErrorHandler (the SDK's call gets no response to parse).
func TestFirstAttemptMatchesEngine(t *testing.T) {
	refuse := func(c *Client, _ *panicOnce) {
		c.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
			return nil, errors.New("connection refused")
		}}}
	}
	cases := []engineCase{
		{name: "201", steps: []step{reply(201, `{"id":"ch_1"}`)}, op: "op-1"},
		{name: "201, no operation", steps: []step{reply(201, `{"id":"ch_1"}`)}},
		{name: "503 then 201", steps: []step{reply(503, ""), reply(201, `{"id":"ch_1"}`)}, op: "op-1"},
		{name: "503 until exhausted", steps: []step{reply(503, "busy")}, op: "op-1"},
		{name: "dropped, then 201", steps: []step{drop, reply(201, `{"id":"ch_1"}`)}, op: "op-1"},
		{name: "dropped every time", steps: []step{drop}, op: "op-1"},
		{name: "refused every time (not sent)", steps: []step{reply(201, "")}, op: "op-1", setup: refuse},
		{name: "400", steps: []step{reply(400, `{"error":"bad"}`)}, op: "op-1"},
		{name: "409 in progress, then 201", steps: []step{reply(409, "", "Idempotency-Status", "in_progress"), reply(201, "{}")}, op: "op-1"},
		{name: "302 on the same origin", steps: []step{reply(302, "", "Location", "/v1/charges/ch_1"), reply(200, `{"id":"ch_1"}`)}, op: "op-1"},
		{name: "307 on the same origin", steps: []step{reply(307, "", "Location", "/v1/charges2"), reply(201, `{"id":"ch_1"}`)}, op: "op-1"},
		{name: "308 to another origin, keyed", steps: []step{reply(308, "", "Location", "http://other.test/v1/charges")}, op: "op-1"},
		{name: "302 without Location", steps: []step{reply(302, "moved")}, op: "op-1"},
		{name: "302 with a Location that does not parse", steps: []step{reply(302, "", "Location", "http://[::1%zz]/")}, op: "op-1"},
		{name: "CheckRedirect refuses", steps: []step{reply(307, "", "Location", "/moved")}, op: "op-1", setup: func(c *Client, _ *panicOnce) {
			c.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return errors.New("no redirects") }}
		}},
		{name: "429 Retry-After too long parks", steps: []step{reply(429, "", "Retry-After", "3600")}, op: "op-1"},
		{name: "PrepareRequest adds a header", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, _ *panicOnce) {
			c.PrepareRequest = func(r *http.Request) error { r.Header.Set("Authorization", "Bearer t"); return nil }
		}},
		{name: "PrepareRequest changes the key", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, _ *panicOnce) {
			c.PrepareRequest = func(r *http.Request) error { r.Header.Set("Idempotency-Key", "mine"); return nil }
		}},
		{name: "Pacer refuses", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, _ *panicOnce) {
			c.Policy.Pacer = pacerFunc{wait: func(context.Context) error { return errors.New("paced out") }}
		}},
		{name: "Pacer lets the first through, refuses the retry", steps: []step{reply(503, ""), reply(201, "{}")}, op: "op-1", setup: func(c *Client, _ *panicOnce) {
			n := 0
			c.Policy.Pacer = pacerFunc{wait: func(context.Context) error {
				if n++; n > 1 {
					return errors.New("paced out")
				}
				return nil
			}}
		}},
		{name: "OnAttempt panics", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, p *panicOnce) {
			h := *c.Hooks
			on := h.OnAttempt
			h.OnAttempt = func(ctx context.Context, ev idemtrace.AttemptEvent) { on(ctx, ev); p.boom() }
			c.Hooks = &h
		}},
		{name: "OnAttemptDone panics", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, p *panicOnce) {
			h := *c.Hooks
			h.OnAttemptDone = func(context.Context, idemtrace.AttemptDoneEvent) { p.boom() }
			c.Hooks = &h
		}},
		{name: "the transport panics", steps: []step{reply(201, "{}")}, op: "op-1", setup: func(c *Client, p *panicOnce) {
			c.HTTPClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				p.boom()
				return http.DefaultTransport.RoundTrip(r)
			})}
		}},
		{name: "CheckRedirect panics", steps: []step{reply(307, "", "Location", "/moved"), reply(201, "{}")}, op: "op-1", setup: func(c *Client, p *panicOnce) {
			c.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { p.boom(); return nil }}
		}},
		{name: "an SDK's call given up on 503", steps: []step{reply(503, `{"error":"busy"}`)}, op: "op-1", sdk: true},
		{name: "an SDK's call parked", steps: []step{reply(429, `{"error":"later"}`, "Retry-After", "3600")}, op: "op-1", sdk: true},
		{name: "an SDK's call, 201 after a drop", steps: []step{drop, reply(201, "{}")}, op: "op-1", sdk: true},
		{name: "streamed, 201", steps: []step{reply(201, "{}")}, streamN: 4 << 10},
		{name: "streamed, 503 then 201", steps: []step{reply(503, ""), reply(201, "{}")}, streamN: 4 << 10},
		{name: "streamed, dropped then 201", steps: []step{drop, reply(201, "{}")}, streamN: 4 << 10},
		{name: "streamed, 307", steps: []step{reply(307, "", "Location", "/v1/charges2"), reply(201, "{}")}, streamN: 4 << 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			engine, direct := callBothWays(t, tc, true), callBothWays(t, tc, false)
			require.NotEmpty(t, engine)
			assert.Equal(t, engine, direct, "the direct first attempt decides as the engine does")
		})
	}
}

// callBothWays makes tc's call, its first attempt through the engine or
// not, and returns its transcript.
func callBothWays(t *testing.T, tc engineCase, engineFirst bool) []string {
	t.Helper()
	srv := newScripted(t, tc.steps...)
	tr := &transcript{}
	c := &Client{Policy: fast(), Hooks: tr.hooks(), clock: newTestClock(parkBase).now}
	c.Policy.MaxAttempts = 3
	if tc.setup != nil {
		tc.setup(c, &panicOnce{})
	}
	c.init()
	c.cfg.engineFirst = engineFirst

	ctx := context.Background()
	if tc.op != "" {
		ctx = WithOperation(ctx, tc.op)
	}
	req := post(t, srv.URL+"/v1/charges", chargeBody)
	if tc.streamN > 0 {
		body := strings.Repeat("x", tc.streamN)
		req = post(t, srv.URL+"/v1/charges", body)
		req.ContentLength = -1 // unknown: streamed, GetBody for the resends
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	var resp *http.Response
	var err error
	panicked := func() (v any) {
		defer func() { v = recover() }()
		if tc.sdk {
			resp, err = c.StandardClient().Do(req.WithContext(ctx))
		} else {
			resp, err = c.Do(req.WithContext(ctx))
		}
		return nil
	}()
	tr.add("panic %v", panicked)
	if resp != nil {
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		info, _ := ResponseInfo(resp)
		tr.add("response %d %q attempts=%d replayed=%v unknown=%v", resp.StatusCode, b, info.Attempts, info.Replayed, info.UnknownOutcome)
	}
	tr.add("error %s", tr.errString(err))
	var parked *ParkedError
	if errors.As(err, &parked) {
		tr.add("parked until %s", parked.NotBefore.Format(time.RFC3339))
	}
	for _, h := range srv.Hits() {
		tr.add("server %s %s body=%d auth=%q key=%v", h.Method, h.Path, len(h.Body), h.Header.Get("Authorization"), h.Key != "")
		tr.key = cmpOr(tr.key, h.Key)
	}
	if tc.op != "" {
		e, lerr := c.cfg.mem.Lookup(context.Background(), tc.op)
		if lerr == nil && e != nil {
			tr.add("journal %s not before %s sent under the key %v", e.State, e.NotBefore.Format(time.RFC3339), e.Key == tr.key)
			tr.key = cmpOr(tr.key, e.Key)
		} else {
			tr.add("journal none (%v)", lerr)
		}
	}
	assert.Zero(t, slots.held(c.cfg.mem), "no slot left held")
	lines := tr.lines
	for i, l := range lines {
		l = strings.ReplaceAll(l, srv.URL, "SRV")
		if tr.key != "" {
			l = strings.ReplaceAll(l, tr.key, "K")
		}
		lines[i] = l
	}
	return lines
}
