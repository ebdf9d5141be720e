package idemserver_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/idemserver"
)

// fpReq is a request for DefaultFingerprint.
type fpReq struct {
	target      string // default /charges
	contentType string
	body        string
	host        string // default example.com
}

func (q fpReq) fingerprint() string {
	target := q.target
	if target == "" {
		target = "/charges"
	}
	r := httptest.NewRequest(http.MethodPost, target, nil)
	if q.host != "" {
		r.Host = q.host
	}
	if q.contentType != "" {
		r.Header.Set("Content-Type", q.contentType)
	}
	return idemserver.DefaultFingerprint(r, []byte(q.body))
}

const ctJSON = "application/json"
const ctForm = "application/x-www-form-urlencoded"

func TestDefaultFingerprint(t *testing.T) {
	tests := []struct {
		name string
		a, b fpReq
		same bool
	}{
		{"JSON member order", fpReq{contentType: ctJSON, body: `{"amount":100,"currency":"usd"}`}, fpReq{contentType: ctJSON, body: `{"currency":"usd","amount":100}`}, true},
		{"JSON whitespace", fpReq{contentType: ctJSON, body: `{"a":[1,2],"b":{"c":null}}`}, fpReq{contentType: ctJSON, body: " {\n\t\"b\" : { \"c\" : null } ,\r\n \"a\" : [ 1 , 2 ] }\n"}, true},
		{"JSON nested order", fpReq{contentType: ctJSON, body: `{"m":{"x":1,"y":2}}`}, fpReq{contentType: ctJSON, body: `{"m":{"y":2,"x":1}}`}, true},
		{"JSON string escapes", fpReq{contentType: ctJSON, body: `{"s":"A/é😀\n"}`}, fpReq{contentType: ctJSON, body: `{"s":"\u0041\/\u00e9\ud83d\ude00\u000a"}`}, true},
		{"JSON charset parameter", fpReq{contentType: "application/json; charset=utf-8", body: `{"a":1,"b":2}`}, fpReq{contentType: ctJSON, body: `{"b":2,"a":1}`}, true},
		{"+json media type", fpReq{contentType: "application/merge-patch+json", body: `{"a":1,"b":2}`}, fpReq{contentType: "Application/Merge-Patch+JSON", body: `{"b":2,"a":1}`}, true},
		{"JSON array order matters", fpReq{contentType: ctJSON, body: `[1,2]`}, fpReq{contentType: ctJSON, body: `[2,1]`}, false},
		{"JSON numbers as written", fpReq{contentType: ctJSON, body: `{"a":1}`}, fpReq{contentType: ctJSON, body: `{"a":1.0}`}, false},
		{"JSON number vs string", fpReq{contentType: ctJSON, body: `{"a":1}`}, fpReq{contentType: ctJSON, body: `{"a":"1"}`}, false},
		{"JSON values differ", fpReq{contentType: ctJSON, body: `{"a":100}`}, fpReq{contentType: ctJSON, body: `{"a":200}`}, false},
		{"JSON duplicate names keep order", fpReq{contentType: ctJSON, body: `{"a":1,"a":2}`}, fpReq{contentType: ctJSON, body: `{"a":2,"a":1}`}, false},
		{"JSON key and value do not run together", fpReq{contentType: ctJSON, body: `{"ab":"c"}`}, fpReq{contentType: ctJSON, body: `{"a":"bc"}`}, false},
		{"JSON null vs empty string", fpReq{contentType: ctJSON, body: `[null]`}, fpReq{contentType: ctJSON, body: `[""]`}, false},
		{"JSON nesting differs", fpReq{contentType: ctJSON, body: `[[1],2]`}, fpReq{contentType: ctJSON, body: `[[1,2]]`}, false},
		{"invalid JSON is raw", fpReq{contentType: ctJSON, body: `{"a":1,"b":2`}, fpReq{contentType: ctJSON, body: `{"b":2,"a":1`}, false},
		{"invalid JSON equal bytes", fpReq{contentType: ctJSON, body: `{"a":`}, fpReq{contentType: ctJSON, body: `{"a":`}, true},
		{"lone surrogate is raw", fpReq{contentType: ctJSON, body: `{"s":"\ud800","t":1}`}, fpReq{contentType: ctJSON, body: `{"t":1,"s":"\ud800"}`}, false},
		{"JSON only for JSON types", fpReq{contentType: "text/plain", body: `{"a":1,"b":2}`}, fpReq{contentType: "text/plain", body: `{"b":2,"a":1}`}, false},
		{"canonical JSON is not raw", fpReq{contentType: ctJSON, body: `{"a":1}`}, fpReq{contentType: "text/plain", body: `{"a":1}`}, false},
		{"form field order", fpReq{contentType: ctForm, body: "amount=100&currency=usd"}, fpReq{contentType: ctForm, body: "currency=usd&amount=100"}, true},
		{"form escapes", fpReq{contentType: ctForm, body: "note=a+b&x=%41"}, fpReq{contentType: ctForm, body: "x=A&note=a%20b"}, true},
		{"form repeated values keep order", fpReq{contentType: ctForm, body: "items[]=a&items[]=b"}, fpReq{contentType: ctForm, body: "items[]=b&items[]=a"}, false},
		{"form values differ", fpReq{contentType: ctForm, body: "amount=100"}, fpReq{contentType: ctForm, body: "amount=200"}, false},
		{"bad form is raw", fpReq{contentType: ctForm, body: "a=%zz&b=1"}, fpReq{contentType: ctForm, body: "b=1&a=%zz"}, false},
		{"other bodies are raw", fpReq{body: "b=1&a=2"}, fpReq{body: "a=2&b=1"}, false},
		{"raw bytes equal", fpReq{body: "\x00\xff"}, fpReq{body: "\x00\xff"}, true},
		{"query order", fpReq{target: "/charges?b=2&a=1"}, fpReq{target: "/charges?a=1&b=2"}, true},
		{"query escapes", fpReq{target: "/charges?q=a+b"}, fpReq{target: "/charges?q=a%20b"}, true},
		{"query repeated values keep order", fpReq{target: "/charges?a=1&a=2"}, fpReq{target: "/charges?a=2&a=1"}, false},
		{"query differs", fpReq{target: "/charges?a=1"}, fpReq{target: "/charges?a=2"}, false},
		{"bad query is raw", fpReq{target: "/charges?a=%zz&b=1"}, fpReq{target: "/charges?b=1&a=%zz"}, false},
		{"path differs", fpReq{target: "/charges"}, fpReq{target: "/refunds"}, false},
		// encoding/json matches names without regard to case, the last
		// one winning: members whose names fold alike keep their order.
		{"JSON names equal but for case keep order", fpReq{contentType: ctJSON, body: `{"Amount":1,"amount":1000}`}, fpReq{contentType: ctJSON, body: `{"amount":1000,"Amount":1}`}, false},
		{"JSON Kelvin sign is a k", fpReq{contentType: ctJSON, body: `{"k":1,"\u212a":2}`}, fpReq{contentType: ctJSON, body: `{"\u212a":2,"k":1}`}, false},
		{"JSON names sort without regard to case", fpReq{contentType: ctJSON, body: `{"b":1,"A":2,"c":{"Y":1,"x":2}}`}, fpReq{contentType: ctJSON, body: `{"c":{"x":2,"Y":1},"A":2,"b":1}`}, true},
		{"JSON names equal but for case, other members moved", fpReq{contentType: ctJSON, body: `{"a":1,"b":0,"A":2}`}, fpReq{contentType: ctJSON, body: `{"b":0,"a":1,"A":2}`}, true},
		// A JSON body sent with a form type is not split at '&'.
		{"JSON with a form type is raw", fpReq{contentType: ctForm, body: `{"x":"1&y=2"}`}, fpReq{contentType: ctForm, body: `y=2"}&{"x":"1`}, false},
		{"JSON with a form type, equal bytes", fpReq{contentType: ctForm, body: `{"x":"1&y=2"}`}, fpReq{contentType: ctForm, body: `{"x":"1&y=2"}`}, true},
		{"form with brackets", fpReq{contentType: ctForm, body: "metadata[a]=1&metadata[b]=2&amount=3"}, fpReq{contentType: ctForm, body: "amount=3&metadata[b]=2&metadata[a]=1"}, true},
		{"form with a space is raw", fpReq{contentType: ctForm, body: "a=1 2&b=3"}, fpReq{contentType: ctForm, body: "b=3&a=1 2"}, false},
		// The Host is not part of the request: a retry may reach another
		// instance under another name.
		{"host differs", fpReq{host: "10.0.0.1:8080"}, fpReq{host: "10.0.0.2:8080"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := tt.a.fingerprint(), tt.b.fingerprint()
			assert.Len(t, a, 64)
			if tt.same {
				assert.Equal(t, a, b)
			} else {
				assert.NotEqual(t, a, b)
			}
		})
	}
}

// TestRetryReencodedIsReplayed: a client library that re-encodes the same
// JSON request with its members in another order gets the replay, not
// 422. (Checked to fail with the byte-level fingerprint: 422.)
func TestRetryReencodedIsReplayed(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(a)
	send := func(target, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k1")
		r.Header.Set("Content-Type", ctJSON)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	first := send("/charges?expand=customer&expand=source&v=2", `{"amount":100,"currency":"usd"}`)
	retry := send("/charges?v=2&expand=customer&expand=source", "{\n  \"currency\": \"usd\",\n  \"amount\": 100\n}")
	assert.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, "true", retry.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, first.Body.String(), retry.Body.String())
	changed := send("/charges?v=2&expand=customer&expand=source", `{"amount":101,"currency":"usd"}`)
	assert.Equal(t, http.StatusUnprocessableEntity, changed.Code)
	assert.Equal(t, int64(1), a.calls.Load())
}

// TestCustomFingerprint: a pluggable fingerprint decides what a retry must
// match; here, the body alone.
func TestCustomFingerprint(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{
		SingleTenant: true,
		Fingerprint:  func(_ *http.Request, body []byte) string { return string(body) },
	}).Wrap(a)
	serve(h, req{key: "k1", target: "/charges?x=1", body: "same"})
	w := serve(h, req{key: "k1", target: "/charges?x=2", body: "same"})
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
	w = serve(h, req{key: "k1", body: "other"})
	assert.Equal(t, http.StatusUnprocessableEntity, w.Code)
}

// TestCaseFoldedNamesNotReplayed: the two requests, which a Go
// handler decodes as amounts 1000 and 1, are not one request: the second
// gets 422, not the first's response. (Checked to fail with names sorted
// by their bytes: the second was replayed the first's response.)
func TestCaseFoldedNamesNotReplayed(t *testing.T) {
	var amounts []int
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v struct{ Amount int }
		_ = json.NewDecoder(r.Body).Decode(&v)
		amounts = append(amounts, v.Amount)
		w.WriteHeader(http.StatusCreated)
	}))
	send := func(body string) int {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k1")
		r.Header.Set("Content-Type", ctJSON)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r) // on this goroutine
		return w.Code
	}
	assert.Equal(t, http.StatusCreated, send(`{"Amount":1,"amount":1000}`))
	assert.Equal(t, http.StatusUnprocessableEntity, send(`{"amount":1000,"Amount":1}`))
	assert.Equal(t, []int{1000}, amounts)
}

// TestHostIsNotPartOfTheRequest: a retry that reaches another instance
// under another host name (a client balancing by address) gets the
// replay, as the documentation of DefaultFingerprint says. (Checked to
// fail with the Host in the fingerprint: 422, which also broke TestTxCrash,
// whose retries reach a new server at another address.)
func TestHostIsNotPartOfTheRequest(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(a)
	q := req{key: "k1", body: "x"}
	first := q.build()
	first.Host = "10.0.0.1:8080"
	h.ServeHTTP(httptest.NewRecorder(), first)
	retry := q.build()
	retry.Host = "10.0.0.2:8080"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, retry)
	assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
	assert.Equal(t, int64(1), a.calls.Load())
}
