package idemserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// app is the handler under the middleware. Its response names the call that
// produced it, so a replay is told from a second run. The path picks the
// outcome: /fail answers 500, /invalid 400, /busy 409, /big a body of 4 KiB.
type app struct {
	calls atomic.Int64
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Add("Set-Cookie", "a=1")
	w.Header().Add("Set-Cookie", "b=2")
	status := http.StatusCreated
	switch r.URL.Path {
	case "/fail":
		status = http.StatusInternalServerError
	case "/invalid":
		status = http.StatusBadRequest
	case "/busy":
		status = http.StatusConflict
	case "/big":
		body = bytes.Repeat([]byte("x"), 4096)
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "call %d tenant %q body %q", n, r.Header.Get("X-Tenant"), body)
}

// req describes a request to the middleware.
type req struct {
	method string // default POST
	target string // default /charges
	key    string // the raw key header value; "" sends none
	body   string
	tenant string // X-Tenant, the test principal
}

func (q req) build() *http.Request {
	method, target := q.method, q.target
	if method == "" {
		method = http.MethodPost
	}
	if target == "" {
		target = "/charges"
	}
	r := httptest.NewRequest(method, target, strings.NewReader(q.body))
	if q.key != "" {
		r.Header.Set("Idempotency-Key", q.key)
	}
	if q.tenant != "" {
		r.Header.Set("X-Tenant", q.tenant)
	}
	return r
}

func tenantOf(r *http.Request) string { return r.Header.Get("X-Tenant") }

// singleTenantUnlessScoped returns mw with SingleTenant set when it has no
// Principal, so table rows need not repeat it.
func singleTenantUnlessScoped(mw idemserver.Middleware) *idemserver.Middleware {
	mw.SingleTenant = mw.Principal == nil
	return &mw
}

// serve sends q to h and returns the recorded response.
func serve(h http.Handler, q req) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, q.build())
	return w
}

// problemType returns the type member of a problem+json response, or "".
func problemType(w *httptest.ResponseRecorder) string {
	if w.Header().Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p idemserver.Problem
	if json.Unmarshal(w.Body.Bytes(), &p) != nil {
		return "unparsable problem"
	}
	return p.Type
}

var big = strings.Repeat("b", 2048)

func TestMiddlewareContract(t *testing.T) {
	post := req{key: "k1", body: `{"amount":100}`}
	tests := []struct {
		name         string
		mw           idemserver.Middleware
		before       []req // sent first, in order
		give         req
		wantStatus   int
		wantType     string // problem type of a middleware error, "" for the handler's response
		wantReplayed bool
		wantCalls    int64 // handler runs, including those of before
	}{
		{name: "new key runs the handler", give: post, wantStatus: 201, wantCalls: 1},
		{name: "completed key replays", before: []req{post}, give: post, wantStatus: 201, wantReplayed: true, wantCalls: 1},
		{name: "quoted form names the same key", before: []req{post}, give: req{key: `"k1"`, body: post.body}, wantStatus: 201, wantReplayed: true, wantCalls: 1},
		{name: "different body is a mismatch", before: []req{post}, give: req{key: "k1", body: `{"amount":200}`}, wantStatus: 422, wantType: idemserver.TypeKeyMismatch, wantCalls: 1},
		{name: "different path is a mismatch", before: []req{post}, give: req{key: "k1", body: post.body, target: "/refunds"}, wantStatus: 422, wantType: idemserver.TypeKeyMismatch, wantCalls: 1},
		{name: "different query is a mismatch", before: []req{post}, give: req{key: "k1", body: post.body, target: "/charges?expand=1"}, wantStatus: 422, wantType: idemserver.TypeKeyMismatch, wantCalls: 1},
		{name: "different method is a mismatch", before: []req{post}, give: req{key: "k1", body: post.body, method: http.MethodPatch}, wantStatus: 422, wantType: idemserver.TypeKeyMismatch, wantCalls: 1},
		{name: "other key runs again", before: []req{post}, give: req{key: "k2", body: post.body}, wantStatus: 201, wantCalls: 2},
		{name: "keyless passes through when optional", before: []req{{body: "x"}}, give: req{body: "x"}, wantStatus: 201, wantCalls: 2},
		{name: "keyless refused when required", mw: idemserver.Middleware{Required: true}, give: req{body: "x"}, wantStatus: 400, wantType: idemserver.TypeKeyMissing},
		{name: "unconfigured method passes through", mw: idemserver.Middleware{Required: true}, before: []req{{method: "PUT", key: "k1"}}, give: req{method: "PUT", key: "k1"}, wantStatus: 201, wantCalls: 2},
		{name: "GET with garbage key passes through", give: req{method: "GET", key: `"`}, wantStatus: 201, wantCalls: 1},
		{name: "configured method replays", mw: idemserver.Middleware{Methods: []string{"PUT"}}, before: []req{{method: "PUT", key: "k1"}}, give: req{method: "PUT", key: "k1"}, wantStatus: 201, wantReplayed: true, wantCalls: 1},
		{name: "POST not configured passes through", mw: idemserver.Middleware{Methods: []string{"PUT"}}, before: []req{post}, give: post, wantStatus: 201, wantCalls: 2},
		{name: "unterminated quoted key", give: req{key: `"k1`}, wantStatus: 400, wantType: idemserver.TypeKeyInvalid},
		{name: "key of 256 bytes", give: req{key: strings.Repeat("k", 256)}, wantStatus: 400, wantType: idemserver.TypeKeyInvalid},
		{name: "key of 255 bytes", give: req{key: strings.Repeat("k", 255)}, wantStatus: 201, wantCalls: 1},
		{name: "non-ASCII key", give: req{key: "clé"}, wantStatus: 400, wantType: idemserver.TypeKeyInvalid},
		{name: "bare only refuses quoted", mw: idemserver.Middleware{KeyForm: idemserver.KeyFormBare}, give: req{key: `"k1"`}, wantStatus: 400, wantType: idemserver.TypeKeyInvalid},
		{name: "quoted only refuses bare", mw: idemserver.Middleware{KeyForm: idemserver.KeyFormQuoted}, give: req{key: "k1"}, wantStatus: 400, wantType: idemserver.TypeKeyInvalid},
		{name: "quoted only takes quoted", mw: idemserver.Middleware{KeyForm: idemserver.KeyFormQuoted}, give: req{key: `"k1"`}, wantStatus: 201, wantCalls: 1},
		{name: "body over MaxBodyBytes", mw: idemserver.Middleware{MaxBodyBytes: 1024}, give: req{key: "k1", body: big}, wantStatus: 413, wantType: idemserver.TypeBodyTooLarge},
		{name: "body at MaxBodyBytes", mw: idemserver.Middleware{MaxBodyBytes: 2048}, give: req{key: "k1", body: big}, wantStatus: 201, wantCalls: 1},
		{name: "5xx releases the key", before: []req{{key: "k1", target: "/fail"}}, give: req{key: "k1", target: "/fail"}, wantStatus: 500, wantCalls: 2},
		{name: "deterministic 4xx is stored", before: []req{{key: "k1", target: "/invalid"}}, give: req{key: "k1", target: "/invalid"}, wantStatus: 400, wantReplayed: true, wantCalls: 1},
		{name: "409 from the handler releases", before: []req{{key: "k1", target: "/busy"}}, give: req{key: "k1", target: "/busy"}, wantStatus: 409, wantCalls: 2},
		{name: "response over MaxStoredBody is not run again", mw: idemserver.Middleware{MaxStoredBody: 1024}, before: []req{{key: "k1", target: "/big"}}, give: req{key: "k1", target: "/big"}, wantStatus: 410, wantType: idemserver.TypeNotReplayable, wantCalls: 1},
		{name: "custom ShouldStore keeps 500s", mw: idemserver.Middleware{ShouldStore: func(int) bool { return true }}, before: []req{{key: "k1", target: "/fail"}}, give: req{key: "k1", target: "/fail"}, wantStatus: 500, wantReplayed: true, wantCalls: 1},
		{name: "same key in another tenant runs", mw: idemserver.Middleware{Principal: tenantOf}, before: []req{{key: "k1", tenant: "a"}}, give: req{key: "k1", tenant: "b"}, wantStatus: 201, wantCalls: 2},
		{name: "same key in the same tenant replays", mw: idemserver.Middleware{Principal: tenantOf}, before: []req{{key: "k1", tenant: "a"}}, give: req{key: "k1", tenant: "a"}, wantStatus: 201, wantReplayed: true, wantCalls: 1},
		{name: "another tenant's key is no mismatch", mw: idemserver.Middleware{Principal: tenantOf}, before: []req{{key: "k1", tenant: "a", body: "x"}}, give: req{key: "k1", tenant: "b", body: "y"}, wantStatus: 201, wantCalls: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := new(app)
			h := singleTenantUnlessScoped(tt.mw).Wrap(a)
			for _, q := range tt.before {
				serve(h, q)
			}
			w := serve(h, tt.give)
			assert.Equal(t, tt.wantStatus, w.Code)
			assert.Equal(t, tt.wantType, problemType(w))
			assert.Equal(t, tt.wantReplayed, w.Header().Get(idemserver.ReplayedHeader) == "true")
			assert.Equal(t, tt.wantCalls, a.calls.Load())
		})
	}
}

func TestReplayIsFaithful(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(a)
	q := req{key: "k1", body: "hello"}
	first := serve(h, q)
	second := serve(h, q)

	require.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, first.Code, second.Code)
	assert.Equal(t, first.Body.String(), second.Body.String())
	assert.Equal(t, `call 1 tenant "" body "hello"`, second.Body.String())
	assert.Equal(t, []string{"a=1", "b=2"}, first.Header().Values("Set-Cookie"))
	assert.Empty(t, second.Header().Values("Set-Cookie"), "a session cookie is never handed out again")
	assert.Equal(t, first.Header().Get("Content-Type"), second.Header().Get("Content-Type"))
	assert.Empty(t, first.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, "true", second.Header().Get(idemserver.ReplayedHeader))
}

// TestReplayOmitsHopByHopHeaders: a header that describes the first
// connection must not be repeated on another.
func TestReplayOmitsHopByHopHeaders(t *testing.T) {
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
		w.Header().Set("X-Kept", "yes")
		w.WriteHeader(http.StatusOK)
	}))
	serve(h, req{key: "k1"})
	w := serve(h, req{key: "k1"})
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, "yes", w.Header().Get("X-Kept"))
	assert.Empty(t, w.Header().Get("Connection"))
}

func TestKeyMissingProblemIsRecognisable(t *testing.T) {
	h := (&idemserver.Middleware{SingleTenant: true, Required: true}).Wrap(new(app))
	w := serve(h, req{body: "x"})

	require.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p idemserver.Problem
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	assert.Equal(t, idemserver.Problem{
		Type:   idemserver.TypeKeyMissing,
		Title:  "Idempotency-Key is missing",
		Status: 400,
		Detail: p.Detail,
	}, p)
	assert.Contains(t, p.Detail, "Idempotency-Key")
}

func TestMultipleKeyHeaders(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(a)
	r := req{key: "k1"}.build()
	r.Header.Add("Idempotency-Key", "k2")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.Equal(t, idemserver.TypeKeyInvalid, problemType(w))
	assert.Zero(t, a.calls.Load())
}

func TestCustomKeyHeader(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true, KeyHeader: "x-idempotency-key", Required: true}).Wrap(a)
	build := func() *http.Request {
		r := req{}.build()
		r.Header.Set("X-Idempotency-Key", "k1")
		return r
	}
	first, second := httptest.NewRecorder(), httptest.NewRecorder()
	h.ServeHTTP(first, build())
	h.ServeHTTP(second, build())
	assert.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, "true", second.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(1), a.calls.Load())

	missing := serve(h, req{key: "k1"}) // Idempotency-Key is not the configured header
	assert.Equal(t, http.StatusBadRequest, missing.Code)
	assert.Contains(t, missing.Body.String(), "X-Idempotency-Key is missing")
}

// TestTenantIsolation proves that one principal can never replay, block or
// probe another's response under the same key.
func TestTenantIsolation(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{Principal: tenantOf}).Wrap(a)

	alice := serve(h, req{key: "shared", tenant: "alice", body: "alice's order"})
	mallory := serve(h, req{key: "shared", tenant: "mallory", body: "alice's order"})
	aliceAgain := serve(h, req{key: "shared", tenant: "alice", body: "alice's order"})

	assert.Equal(t, http.StatusCreated, mallory.Code)
	assert.Empty(t, mallory.Header().Get(idemserver.ReplayedHeader), "mallory's request ran on its own")
	assert.NotContains(t, mallory.Body.String(), `tenant "alice"`, "mallory never sees alice's response")
	assert.Equal(t, `call 2 tenant "mallory" body "alice's order"`, mallory.Body.String())
	assert.Equal(t, alice.Body.String(), aliceAgain.Body.String(), "alice still gets her own replay")
	assert.Equal(t, "true", aliceAgain.Header().Get(idemserver.ReplayedHeader))
}

// TestTenantScopesDoNotCollide: the store key joins scope and key without
// ambiguity, so a tenant cannot forge a scope that reaches another's key.
func TestTenantScopesDoNotCollide(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{Principal: tenantOf}).Wrap(a)
	serve(h, req{key: "b:k", tenant: "a"})
	w := serve(h, req{key: "k", tenant: "a:b"})
	assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(2), a.calls.Load())
}

func TestPanicReleasesKey(t *testing.T) {
	tests := []struct {
		name string
		give any // the panic value
	}{
		{"plain panic", "boom"},
		{"abort handler", http.ErrAbortHandler},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int64
			h := (&idemserver.Middleware{SingleTenant: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if calls.Add(1) == 1 {
					panic(tt.give)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			assert.PanicsWithValue(t, tt.give, func() { serve(h, req{key: "k1"}) }, "the panic reaches net/http unchanged")
			w := serve(h, req{key: "k1"})
			assert.Equal(t, http.StatusCreated, w.Code, "the key was released, so the retry ran")
			assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
			assert.Equal(t, int64(2), calls.Load())
		})
	}
}

func TestCustomWriteError(t *testing.T) {
	h := (&idemserver.Middleware{
		SingleTenant: true,
		Required:     true,
		WriteError: func(w http.ResponseWriter, _ *http.Request, p *idemserver.Problem) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(p.Status)
			fmt.Fprintf(w, `{"error":%q}`, p.Title)
		},
	}).Wrap(new(app))
	w := serve(h, req{})
	assert.Equal(t, http.StatusBadRequest, w.Code)
	assert.JSONEq(t, `{"error":"Idempotency-Key is missing"}`, w.Body.String())
}

// TestHandlerReadsBody: the body was read for the fingerprint, and the
// handler still reads it whole, on the first run and in chunked requests.
func TestHandlerReadsBody(t *testing.T) {
	tests := []struct {
		name string
		give io.Reader
	}{
		{"known length", strings.NewReader("payload")},
		{"unknown length", io.MultiReader(strings.NewReader("pay"), strings.NewReader("load"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []byte
			h := (&idemserver.Middleware{SingleTenant: true}).Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				got, _ = io.ReadAll(r.Body)
			}))
			r := httptest.NewRequest(http.MethodPost, "/", tt.give)
			r.Header.Set("Idempotency-Key", "k1")
			h.ServeHTTP(httptest.NewRecorder(), r)
			assert.Equal(t, "payload", string(got))
		})
	}
}

func TestUnknownLengthBodyTooLarge(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true, MaxBodyBytes: 8}).Wrap(a)
	r := httptest.NewRequest(http.MethodPost, "/", io.MultiReader(strings.NewReader("0123"), strings.NewReader("45678")))
	r.Header.Set("Idempotency-Key", "k1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	assert.Zero(t, a.calls.Load())
}

// TestStreamingHandlers: a handler that flushes keeps working, and one that
// hijacks the connection, or switches protocols, leaves its key completed
// but not replayable: a retry gets 410 and never runs it again. (Checked to
// fail with the key released after a hijack, as before: the retry ran the
// hijacking handler a second time.)
func TestStreamingHandlers(t *testing.T) {
	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/flush", func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		fmt.Fprint(w, "part1 ")
		if err := http.NewResponseController(w).Flush(); err != nil {
			fmt.Fprint(w, "flush failed ")
		}
		fmt.Fprint(w, "part2")
	})
	mux.HandleFunc("/hijack", func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		defer conn.Close()
		fmt.Fprint(buf, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nraw ok")
		_ = buf.Flush()
	})
	mux.HandleFunc("/upgrade", func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "example/1")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = buf.Flush()
	})
	// served reports each request's end, after the middleware stored or
	// released its key: a hijacked response reaches the client before that.
	served := make(chan struct{}, 1)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(mux)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { served <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	post := func(path string) (string, bool) {
		defer func() { <-served }()
		r, err := http.NewRequest(http.MethodPost, srv.URL+path, nil)
		require.NoError(t, err)
		r.Header.Set("Idempotency-Key", "k"+path)
		resp, err := srv.Client().Do(r)
		require.NoError(t, err)
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusSwitchingProtocols {
			return "101", false
		}
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		if resp.StatusCode == http.StatusGone {
			var p idemserver.Problem
			require.NoError(t, json.Unmarshal(b, &p))
			return fmt.Sprint("410 ", p.Type == idemserver.TypeNotReplayable, " ", p.OriginalStatus), false
		}
		return string(b), resp.Header.Get(idemserver.ReplayedHeader) == "true"
	}
	body, _ := post("/flush")
	replayed, isReplay := post("/flush")
	assert.Equal(t, "part1 part2", body)
	assert.Equal(t, body, replayed)
	assert.True(t, isReplay)

	raw1, _ := post("/hijack")
	raw2, _ := post("/hijack")
	assert.Equal(t, "raw ok", raw1)
	assert.Equal(t, "410 true 0", raw2, "a hijacked handler ran: its key stays completed")
	up1, _ := post("/upgrade")
	up2, _ := post("/upgrade")
	assert.Equal(t, "101", up1)
	assert.Equal(t, "410 true 101", up2)
	assert.Equal(t, int64(3), calls.Load(), "each handler ran once")
}

func TestKeyFormString(t *testing.T) {
	tests := []struct {
		give idemserver.KeyForm
		want string
	}{
		{idemserver.KeyFormAny, "any"},
		{idemserver.KeyFormBare, "bare"},
		{idemserver.KeyFormQuoted, "quoted"},
		{idemserver.KeyForm(9), "KeyForm(9)"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.give.String())
	}
}

func TestDefaultShouldStore(t *testing.T) {
	tests := []struct {
		give int
		want bool
	}{
		{200, true}, {201, true}, {204, true}, {303, true},
		{400, true}, {402, true}, {404, true}, {422, true},
		{401, false}, {403, false}, {408, false}, {409, false}, {423, false}, {425, false}, {429, false},
		{500, false}, {502, false}, {503, false}, {504, false},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, idemserver.DefaultShouldStore(tt.give), "status %d", tt.give)
	}
}

// TestZeroValueMiddlewaresAreIndependent: each Wrap of a Middleware with no
// Store gets its own memory store.
func TestZeroValueMiddlewaresAreIndependent(t *testing.T) {
	mw := idemserver.Middleware{SingleTenant: true}
	a := new(app)
	h1, h2 := mw.Wrap(a), mw.Wrap(a)
	serve(h1, req{key: "k1"})
	w := serve(h2, req{key: "k1"})
	assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(2), a.calls.Load())
}

// TestSharedStore: two handlers (two server instances) sharing a store see
// each other's keys.
func TestSharedStore(t *testing.T) {
	mw := idemserver.Middleware{SingleTenant: true, Store: new(idemserver.MemoryStore)}
	a := new(app)
	h1, h2 := mw.Wrap(a), mw.Wrap(a)
	serve(h1, req{key: "k1"})
	w := serve(h2, req{key: "k1"})
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(1), a.calls.Load())
}

// TestUnconfiguredMethodUntouched: a method the middleware does not cover
// reaches the handler with the very body, header and writer it arrived with.
func TestUnconfiguredMethodUntouched(t *testing.T) {
	body := &readCloser{Reader: strings.NewReader(`{"x":1}`)}
	r := httptest.NewRequest(http.MethodPut, "/things/1", nil)
	r.Body = body
	r.Header.Set("Idempotency-Key", `"garbage`)
	w := httptest.NewRecorder()
	var (
		gotBody   io.ReadCloser
		gotWriter http.ResponseWriter
		gotKey    string
	)
	h := (&idemserver.Middleware{SingleTenant: true, Required: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotBody, gotWriter, gotKey = r.Body, w, r.Header.Get("Idempotency-Key")
		w.WriteHeader(http.StatusNoContent)
	}))
	h.ServeHTTP(w, r)
	assert.Same(t, body, gotBody)
	assert.Same(t, w, gotWriter)
	assert.Equal(t, `"garbage`, gotKey)
	assert.Equal(t, http.StatusNoContent, w.Code)
	assert.Empty(t, w.Header().Get(idemserver.ReplayedHeader))
}

// readCloser is a request body with an identity to compare.
type readCloser struct{ io.Reader }

func (*readCloser) Close() error { return nil }

// TestExtremeLimits: any MaxBodyBytes and MaxStoredBody, up to the largest
// the types hold, serves a small request without a panic, with a body of
// known or unknown length, and a handler that declares a length far
// beyond what it writes. (Checked to fail before the fix: MaxBodyBytes of
// math.MaxInt64 overflowed limit+1 and make panicked with "cap out of
// range" on a body of unknown length; MaxStoredBody of math.MaxInt
// reserved the declared 2^62 bytes and panicked the same way.)
func TestExtremeLimits(t *testing.T) {
	tests := []struct {
		give      int64
		giveStore int
	}{
		{math.MaxInt64, math.MaxInt},
		{math.MaxInt64 - 1, math.MaxInt - 1},
		{math.MaxInt32, math.MaxInt32},
		{1 << 62, 1 << 62},
		{math.MinInt64, math.MinInt},
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", strconv.FormatInt(1<<62, 10))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	for _, tt := range tests {
		for _, known := range []bool{true, false} {
			t.Run(fmt.Sprint(tt.give, known), func(t *testing.T) {
				mw := (&idemserver.Middleware{SingleTenant: true, MaxBodyBytes: tt.give, MaxStoredBody: tt.giveStore}).Wrap(h)
				r := req{key: "k1", body: "small"}.build()
				if !known {
					r.ContentLength = -1
				}
				w := httptest.NewRecorder()
				require.NotPanics(t, func() { mw.ServeHTTP(w, r) })
				assert.Equal(t, http.StatusCreated, w.Code)
				assert.Equal(t, "small", w.Body.String())
			})
		}
	}
}

// hijackRecorder is a ResponseRecorder whose connection can be hijacked:
// one end of a pipe, the other end closed.
type hijackRecorder struct{ *httptest.ResponseRecorder }

func (h hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, other := net.Pipe()
	_ = other.Close()
	return c, bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c)), nil
}

// TestHijackWithCancelledContext: a handler that takes the connection
// while its request's context is done has run all the same; its key is
// kept, not released as that of a handler that gave up without answering.
// (Checked to fail with the cancellation check before the hijack's: the
// retry ran the handler again.)
func TestHijackWithCancelledContext(t *testing.T) {
	var calls atomic.Int64
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.ServeHTTP(hijackRecorder{httptest.NewRecorder()}, req{key: "k1"}.build().WithContext(ctx))
	retry := serve(h, req{key: "k1"})
	assert.Equal(t, http.StatusGone, retry.Code)
	assert.Equal(t, int64(1), calls.Load())
}
