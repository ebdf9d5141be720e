package idemtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemtest"
)

// outcome is what one request got.
type outcome struct {
	status int
	header http.Header
	body   string
	err    error
}

func (o outcome) replayed() bool { return o.header.Get(idemserver.ReplayedHeader) == "true" }

// request is a POST to the fake API.
type request struct {
	path        string // default /v1/charges
	key         string // raw key header value; "" sends none
	contentType string // default application/json
	body        string
	auth        string // Authorization
}

func (q request) send(c *http.Client, base string) outcome {
	path, ct := q.path, q.contentType
	if path == "" {
		path = "/v1/charges"
	}
	if ct == "" {
		ct = "application/json"
	}
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(q.body))
	if err != nil {
		return outcome{err: err}
	}
	req.Header.Set("Content-Type", ct)
	if q.key != "" {
		req.Header.Set("Idempotency-Key", q.key)
	}
	if q.auth != "" {
		req.Header.Set("Authorization", q.auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return outcome{status: resp.StatusCode, header: resp.Header, body: string(b), err: err}
}

func chargeBody(op string) string {
	return fmt.Sprintf(`{"amount":2000,"currency":"usd","operation":%q}`, op)
}

func TestCreateCharge(t *testing.T) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	form := url.Values{"amount": {"2000"}, "currency": {"USD"}, "metadata[operation]": {"order-2"}, "metadata[customer]": {"c1"}}.Encode()

	tests := []struct {
		name string
		give request
		op   string
	}{
		{"json", request{key: "k1", body: chargeBody("order-1")}, "order-1"},
		{"form like stripe-go", request{key: "k2", contentType: "application/x-www-form-urlencoded", body: form}, "order-2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := tt.give.send(srv.Client(), srv.URL)
			again := tt.give.send(srv.Client(), srv.URL)
			require.NoError(t, first.err)
			require.NoError(t, again.err)

			var ch map[string]any
			require.NoError(t, json.Unmarshal([]byte(first.body), &ch))
			assert.Equal(t, http.StatusOK, first.status)
			assert.Equal(t, "charge", ch["object"])
			assert.Regexp(t, `^ch_[0-9]{24}$`, ch["id"])
			assert.InDelta(t, 2000, ch["amount"], 0)
			assert.Equal(t, "usd", ch["currency"])
			assert.Equal(t, "succeeded", ch["status"])
			assert.Equal(t, tt.op, ch["metadata"].(map[string]any)["operation"])
			assert.True(t, again.replayed())
			assert.Equal(t, first.body, again.body)
			assert.Equal(t, 1, srv.Executions(tt.op))
		})
	}
	st := srv.Stats()
	assert.Equal(t, 4, st.Requests)
	assert.Equal(t, 2, st.Executions)
	assert.Equal(t, 2, st.Replays)
	assert.Zero(t, st.Duplicates)
}

func TestChargeValidation(t *testing.T) {
	tests := []struct {
		name      string
		give      string
		wantParam string
	}{
		{"missing amount", `{"currency":"usd","operation":"op"}`, "amount"},
		{"negative amount", `{"amount":-5,"currency":"usd","operation":"op"}`, "amount"},
		{"fractional amount", `{"amount":1.5,"currency":"usd","operation":"op"}`, "amount"},
		{"missing currency", `{"amount":100,"operation":"op"}`, "currency"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := idemtest.NewServer(nil)
			defer srv.Close()
			got := request{key: "k", body: tt.give}.send(srv.Client(), srv.URL)
			require.NoError(t, got.err)
			var e struct {
				Error struct{ Type, Param string }
			}
			require.NoError(t, json.Unmarshal([]byte(got.body), &e))
			assert.Equal(t, http.StatusBadRequest, got.status)
			assert.Equal(t, "invalid_request_error", e.Error.Type)
			assert.Equal(t, tt.wantParam, e.Error.Param)
			assert.Zero(t, srv.Executions("op"), "a refused charge has no side effect")
		})
	}
}

func TestGenericEndpoint(t *testing.T) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	got := request{path: "/v1/transfers", key: "k1", body: `{"operation":"t-1"}`}.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	assert.Contains(t, got.body, `"operation":"t-1"`)

	resp, err := srv.Client().Get(srv.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, map[string]int{"t-1": 1}, srv.Snapshot(), "GET has no side effect")
}

func TestOperationIdentity(t *testing.T) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	c := srv.Client()
	request{path: "/x", key: "key-only", body: `{}`}.send(c, srv.URL)
	request{path: "/x", body: `{}`}.send(c, srv.URL)
	request{path: "/x", key: "k", body: `{"operation":"named"}`}.send(c, srv.URL)
	assert.Equal(t, map[string]int{"key-only": 1, "": 1, "named": 1}, srv.Snapshot())
}

func TestKeysScopedByAuthorization(t *testing.T) {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	a := request{path: "/x", key: "k", body: `{"operation":"op"}`, auth: "Bearer sk_test_a"}
	b := a
	b.auth = "Bearer sk_test_b"
	a.send(srv.Client(), srv.URL)
	got := b.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.False(t, got.replayed(), "another API key never gets this key's replay")
	assert.Equal(t, 2, srv.Executions("op"))
}

func TestVariants(t *testing.T) {
	first := request{key: "k1", body: chargeBody("op")}
	tests := []struct {
		name         string
		opts         idemtest.Options
		before       []request
		give         request
		wantStatus   int
		wantBody     string // a substring of the body
		wantReplayed bool
		wantHeader   http.Header // headers that must be present
	}{
		{name: "key optional by default", give: request{body: chargeBody("op")}, wantStatus: 200},
		{name: "key required", opts: idemtest.Options{RequireKey: true}, give: request{body: chargeBody("op")}, wantStatus: 400, wantBody: idemserver.TypeKeyMissing},
		{name: "both forms by default", before: []request{first}, give: request{key: `"k1"`, body: chargeBody("op")}, wantStatus: 200, wantReplayed: true},
		{name: "bare required", opts: idemtest.Options{KeyForm: idemserver.KeyFormBare}, give: request{key: `"k1"`, body: chargeBody("op")}, wantStatus: 400, wantBody: idemserver.TypeKeyInvalid},
		{name: "quoted required", opts: idemtest.Options{KeyForm: idemserver.KeyFormQuoted}, give: first, wantStatus: 400, wantBody: idemserver.TypeKeyInvalid},
		{name: "IETF mismatch", before: []request{first}, give: request{key: "k1", body: chargeBody("other")}, wantStatus: 422, wantBody: idemserver.TypeKeyMismatch,
			wantHeader: http.Header{"Content-Type": {"application/problem+json"}}},
		{name: "Stripe mismatch", opts: idemtest.Options{StripeErrors: true}, before: []request{first}, give: request{key: "k1", body: chargeBody("other")}, wantStatus: 400, wantBody: `{"error":{"type":"idempotency_error"`,
			wantHeader: http.Header{"Content-Type": {"application/json"}, "Stripe-Should-Retry": {"false"}}},
		{name: "replay marked", before: []request{first}, give: first, wantStatus: 200, wantReplayed: true},
		{name: "replay silent", opts: idemtest.Options{OmitReplayHeader: true}, before: []request{first}, give: first, wantStatus: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := idemtest.NewServer(&tt.opts)
			defer srv.Close()
			for _, q := range tt.before {
				q.send(srv.Client(), srv.URL)
			}
			got := tt.give.send(srv.Client(), srv.URL)
			require.NoError(t, got.err)
			assert.Equal(t, tt.wantStatus, got.status)
			assert.Contains(t, got.body, tt.wantBody)
			assert.Equal(t, tt.wantReplayed, got.replayed())
			for k := range tt.wantHeader {
				assert.Equal(t, tt.wantHeader.Get(k), got.header.Get(k), "header %s", k)
			}
		})
	}
}

func TestSilentReplaysAreCounted(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{OmitReplayHeader: true})
	defer srv.Close()
	q := request{key: "k1", body: chargeBody("op")}
	q.send(srv.Client(), srv.URL)
	got := q.send(srv.Client(), srv.URL)
	assert.False(t, got.replayed())
	assert.Equal(t, 1, srv.Stats().Replays)
	assert.Equal(t, 1, srv.Executions("op"))
}

// TestFaultKinds injects each fault into one request of an operation
// (its first, or for 409s its second) (rate 1, at most one per operation) and checks what the first and
// the second request get, and how many times the work ran.
func TestFaultKinds(t *testing.T) {
	tests := []struct {
		name        string
		give        idemtest.Faults
		wantFirst   int // status of the first request; 0 for a dropped connection
		wantSecond  int
		wantReplay  bool // the second answer is a replay
		wantExecs   int
		wantRetryAt string // Retry-After of the first answer
	}{
		{name: "drop request", give: idemtest.Faults{DropRequest: 1}, wantFirst: 0, wantSecond: 200, wantExecs: 1},
		{name: "drop response", give: idemtest.Faults{DropResponse: 1}, wantFirst: 0, wantSecond: 200, wantReplay: true, wantExecs: 1},
		{name: "slow", give: idemtest.Faults{Slow: 1, SlowDelay: time.Millisecond}, wantFirst: 200, wantSecond: 200, wantReplay: true, wantExecs: 1},
		{name: "unavailable", give: idemtest.Faults{Unavailable: 1, RetryAfter: 1500 * time.Millisecond}, wantFirst: 503, wantSecond: 200, wantExecs: 1, wantRetryAt: "2"},
		// A 409 "in progress" is never injected into the first request of
		// an operation: the server cannot be processing a key it never saw.
		{name: "conflict burst of one", give: idemtest.Faults{Conflict: 1, ConflictBurst: 1}, wantFirst: 200, wantSecond: 409, wantExecs: 1},
		{name: "stored 500", give: idemtest.Faults{Stored500: 1}, wantFirst: 500, wantSecond: 500, wantReplay: true, wantExecs: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.give.MaxPerOperation = 1
			srv := idemtest.NewServer(&idemtest.Options{Faults: tt.give})
			defer srv.Close()
			q := request{key: "k1", body: chargeBody("op")}
			first := q.send(srv.Client(), srv.URL)
			second := q.send(srv.Client(), srv.URL)

			if tt.wantFirst == 0 {
				assert.Error(t, first.err, "the connection closed without a reply")
			} else {
				require.NoError(t, first.err)
				assert.Equal(t, tt.wantFirst, first.status)
				assert.Equal(t, tt.wantRetryAt, first.header.Get("Retry-After"))
			}
			require.NoError(t, second.err)
			assert.Equal(t, tt.wantSecond, second.status)
			assert.Equal(t, tt.wantReplay, second.replayed())
			assert.Equal(t, tt.wantExecs, srv.Executions("op"))
			assert.Equal(t, 1, srv.Stats().Faults[idemtest.FaultKind(strings.ReplaceAll(strings.ReplaceAll(tt.name, " burst of one", ""), " ", "-"))])
		})
	}
}

func TestConflictBurst(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Conflict: 1, MaxPerOperation: 1}})
	defer srv.Close()
	q := request{key: "k1", body: chargeBody("op")}
	var statuses []int
	for range 5 {
		got := q.send(srv.Client(), srv.URL)
		require.NoError(t, got.err)
		statuses = append(statuses, got.status)
	}
	assert.Equal(t, []int{200, 409, 409, 409, 200}, statuses)
	assert.Equal(t, 3, srv.Stats().Faults[idemtest.FaultConflict], "every 409 of the burst counts")
}

func TestSlowReplyIsLate(t *testing.T) {
	const delay = 30 * time.Millisecond
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Slow: 1, SlowDelay: delay}})
	defer srv.Close()
	start := time.Now()
	got := request{key: "k1", body: chargeBody("op")}.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	assert.GreaterOrEqual(t, time.Since(start), delay)
}

// fakeClock moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestOutageWindow(t *testing.T) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := idemtest.NewServer(&idemtest.Options{
		Now:    clk.Now,
		Faults: idemtest.Faults{Outages: []idemtest.Window{{Start: time.Minute, End: 2 * time.Minute}}},
	})
	defer srv.Close()
	send := func(op string) outcome {
		return request{key: op, body: chargeBody(op)}.send(srv.Client(), srv.URL)
	}

	before := send("a")
	clk.Advance(90 * time.Second)
	during := send("b")
	clk.Advance(time.Minute)
	after := send("b")

	assert.Equal(t, http.StatusOK, before.status)
	assert.Equal(t, http.StatusServiceUnavailable, during.status)
	assert.Contains(t, during.body, idemtest.TypeOutage)
	assert.Equal(t, "0", during.header.Get("Retry-After"))
	assert.Equal(t, http.StatusOK, after.status)
	assert.Equal(t, map[string]int{"a": 1, "b": 1}, srv.Snapshot())
	assert.Equal(t, 1, srv.Stats().Faults[idemtest.FaultOutage])
}

func TestStripeFaultErrors(t *testing.T) {
	srv := idemtest.NewServer(&idemtest.Options{StripeErrors: true, Faults: idemtest.Faults{Unavailable: 1, MaxPerOperation: 1}})
	defer srv.Close()
	got := request{key: "k1", body: chargeBody("op")}.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusServiceUnavailable, got.status)
	assert.Equal(t, "true", got.header.Get("Stripe-Should-Retry"))
	assert.Contains(t, got.body, `"type":"api_error"`)
}

// TestSameSeedSameFaults: two servers with one seed, driven concurrently
// with the same per-operation request sequence in different orders, inject
// the same faults.
//
// Keep-alives are off: on a reused connection net/http's Transport resends
// a keyed request that got no reply by itself, and whether a connection is
// reused depends on timing, so the server would see a varying number of
// requests per operation.
func TestSameSeedSameFaults(t *testing.T) {
	faults := idemtest.Faults{Seed: 42, DropRequest: 0.15, DropResponse: 0.15, Unavailable: 0.15, Conflict: 0.1, Stored500: 0.05}
	run := func() idemtest.Stats {
		srv := idemtest.NewServer(&idemtest.Options{Faults: faults})
		defer srv.Close()
		c := srv.Client()
		c.Transport.(*http.Transport).DisableKeepAlives = true
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				op := fmt.Sprint("op-", i)
				for range 5 {
					request{key: op, body: chargeBody(op)}.send(c, srv.URL)
				}
			}()
		}
		wg.Wait()
		return srv.Stats()
	}
	one, two := run(), run()
	assert.Equal(t, one.Faults, two.Faults)
	assert.Equal(t, 100, one.Requests)
	assert.Zero(t, one.Duplicates)
}

func TestStatsString(t *testing.T) {
	st := idemtest.Stats{Requests: 3, Executions: 1, Operations: 1, Replays: 1, Faults: map[idemtest.FaultKind]int{idemtest.FaultDropResponse: 1}}
	assert.Equal(t, "requests=3 executions=1 operations=1 duplicates=0 replays=1 conflicts=0 mismatches=0 drop-request=0 drop-response=1 slow=0 unavailable=0 conflict=0 stored-500=0 outage=0 rate-limited=0", st.String())
}

func TestCloseTwice(t *testing.T) {
	srv := idemtest.NewServer(nil)
	srv.Close()
	assert.NotPanics(t, srv.Close)
}

// TestBodyOneRule: the operation a body names (Operation) and the
// parameters the charge reads come from one decision, so a body the
// server takes an operation from is a body it charges. Before, a JSON body
// sent without Content-Type named its operation (sniffed as JSON) but was
// read as a form: 400 "Missing required param: amount". Checked: with
// params decoding by Content-Type alone again, "json without content
// type" fails.
func TestBodyOneRule(t *testing.T) {
	tests := []struct {
		name        string
		contentType string // "" sends no Content-Type
		give        string
		wantStatus  int
		wantOp      string
	}{
		{"json", "application/json", `{"amount":100,"currency":"usd","operation":"o1"}`, 200, "o1"},
		{"json without content type", "", `{"amount":100,"currency":"usd","operation":"o2"}`, 200, "o2"},
		{"json with leading space without content type", "", " \n{\"amount\":100,\"currency\":\"usd\",\"operation\":\"o3\"}", 200, "o3"},
		{"form", "application/x-www-form-urlencoded", "amount=100&currency=usd&metadata[operation]=o4", 200, "o4"},
		{"form without content type", "", "amount=100&currency=usd&operation=o5", 200, "o5"},
		{"another type names nothing and charges nothing", "text/plain", "amount=100&currency=usd&operation=o6", 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := idemtest.NewServer(nil)
			defer srv.Close()
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(tt.give))
			require.NoError(t, err)
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := srv.Client().Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var ch struct{ Metadata map[string]string }
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&ch))

			assert.Equal(t, tt.wantOp, idemtest.Operation(tt.contentType, []byte(tt.give)))
			assert.Equal(t, tt.wantStatus, resp.StatusCode)
			if tt.wantOp != "" {
				assert.Equal(t, tt.wantOp, ch.Metadata["operation"])
				assert.Equal(t, map[string]int{tt.wantOp: 1}, srv.Snapshot())
			} else {
				assert.Empty(t, srv.Snapshot())
			}
		})
	}
}

// TestRateLimit: beyond RateLimit a second (a bucket of RateBurst) the
// server answers 429 with Retry-After and runs nothing; the bucket refills
// on the server's clock. Checked: with decide's limiter check removed, the
// third request is served and the test fails.
func TestRateLimit(t *testing.T) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	srv := idemtest.NewServer(&idemtest.Options{
		Now:    clk.Now,
		Faults: idemtest.Faults{RateLimit: 2, RateBurst: 2, RetryAfter: time.Second},
	})
	defer srv.Close()
	send := func(op string) outcome {
		return request{key: op, body: chargeBody(op)}.send(srv.Client(), srv.URL)
	}

	var statuses []int
	for _, op := range []string{"a", "b", "c"} {
		statuses = append(statuses, send(op).status)
	}
	limited := send("c")
	clk.Advance(500 * time.Millisecond) // one token back
	after := send("c")

	assert.Equal(t, []int{200, 200, 429}, statuses)
	assert.Equal(t, http.StatusTooManyRequests, limited.status)
	assert.Equal(t, "1", limited.header.Get("Retry-After"))
	assert.Contains(t, limited.body, idemtest.TypeRateLimited)
	assert.Equal(t, http.StatusOK, after.status)
	assert.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, srv.Snapshot())
	assert.Equal(t, 2, srv.Stats().Faults[idemtest.FaultRateLimited])
}

// TestRateLimitLeavesDecisions: requests refused by the rate limit do not
// count in an operation's fault decisions, so the faults a seed gives an
// operation are the same with or without a limit. Checked: counting them
// (decide's limiter check after the draw) changes the sequence.
func TestRateLimitLeavesDecisions(t *testing.T) {
	faults := idemtest.Faults{Seed: 7, Unavailable: 0.5}
	run := func(limit float64) []int {
		clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
		f := faults
		f.RateLimit, f.RateBurst = limit, 1
		srv := idemtest.NewServer(&idemtest.Options{Now: clk.Now, Faults: f})
		defer srv.Close()
		var got []int
		for len(got) < 8 {
			st := request{key: "k", body: chargeBody("op")}.send(srv.Client(), srv.URL).status
			if st == http.StatusTooManyRequests {
				clk.Advance(time.Second)
				continue
			}
			got = append(got, st)
		}
		return got
	}
	assert.Equal(t, run(0), run(1))
}

// TestLatency: every request waits Latency before it is served.
func TestLatency(t *testing.T) {
	const delay = 30 * time.Millisecond
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Latency: delay}})
	defer srv.Close()
	start := time.Now()
	got := request{key: "k1", body: chargeBody("op")}.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	assert.GreaterOrEqual(t, time.Since(start), delay)
}

// TestListener: a server on the caller's listener serves there, names it
// in URL, and closes it.
func TestListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := idemtest.NewServer(&idemtest.Options{Listener: ln})
	assert.Equal(t, "http://"+ln.Addr().String(), srv.URL)
	got := request{key: "k1", body: chargeBody("op")}.send(srv.Client(), srv.URL)
	require.NoError(t, got.err)
	assert.Equal(t, http.StatusOK, got.status)
	srv.Close()
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "Close closed the listener")
}
