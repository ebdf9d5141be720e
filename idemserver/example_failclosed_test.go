package idemserver_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idemhttp/idemserver"
)

// Wrap panics on a Middleware that says neither whose keys a request
// carries nor that one party sends them all, as http.ServeMux panics on a
// bad pattern: the mistake shows where the routes are built, before any
// request is served.
func ExampleMiddleware_Wrap() {
	var charges atomic.Int64
	func() {
		defer func() {
			err, _ := recover().(error)
			fmt.Println(errors.Is(err, idemserver.ErrMisconfigured))
		}()
		new(idemserver.Middleware).Wrap(chargeHandler(&charges))
	}()

	h := (&idemserver.Middleware{SingleTenant: true}).Wrap(chargeHandler(&charges))
	fmt.Println(h != nil)
	// Output:
	// true
	// true
}

// Replays carry the header fields the handler set, minus Set-Cookie and
// OmitHeaders; fields set by middleware outside (here a request id) are
// its own to set again.
func ExampleMiddleware_replayHeaders() {
	inner := (&idemserver.Middleware{SingleTenant: true, OmitHeaders: []string{"X-Trace"}}).Wrap(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "/v1/charges/ch_1")
			w.Header().Set("X-Trace", "trace-1")
			w.Header().Set("Set-Cookie", "session=s3cr3t")
			w.WriteHeader(http.StatusCreated)
		}))
	var ids atomic.Int64
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", fmt.Sprint("req-", ids.Add(1)))
		inner.ServeHTTP(w, r)
	})
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		outer.ServeHTTP(w, r)
		h := w.Header()
		fmt.Printf("replayed=%q location=%q trace=%q cookie=%q request-id=%q\n",
			h.Get(idemserver.ReplayedHeader), h.Get("Location"), h.Get("X-Trace"), h.Get("Set-Cookie"), h.Get("X-Request-Id"))
	}
	// Output:
	// replayed="" location="/v1/charges/ch_1" trace="trace-1" cookie="session=s3cr3t" request-id="req-1"
	// replayed="true" location="/v1/charges/ch_1" trace="" cookie="" request-id="req-2"
}

// Requests are compared by meaning: the same JSON with its members in
// another order and other whitespace has the same fingerprint; the same
// bytes under another multipart boundary or charset, which a handler
// reads differently, do not.
func ExampleDefaultFingerprint() {
	fp := func(contentType, target, body string) string {
		r := httptest.NewRequest(http.MethodPost, target, nil)
		r.Header.Set("Content-Type", contentType)
		return idemserver.DefaultFingerprint(r, []byte(body))[:12]
	}
	fmt.Println(fp("application/json", "/v1/charges?a=1&b=2", `{"amount":100,"currency":"usd"}`) ==
		fp("application/json", "/v1/charges?b=2&a=1", "{\n  \"currency\": \"usd\",\n  \"amount\": 100\n}"))
	fmt.Println(fp("application/json", "/v1/charges", `{"amount":100}`) ==
		fp("application/json", "/v1/charges", `{"amount":100.0}`))
	fmt.Println(fp("application/x-www-form-urlencoded", "/v1/charges", "amount=100&currency=usd") ==
		fp("application/x-www-form-urlencoded", "/v1/charges", "currency=usd&amount=100"))
	body := "--a\r\n\r\n--b\r\n\r\n1\r\n--b--\r\n--a--\r\n"
	fmt.Println(fp("multipart/form-data; boundary=a", "/v1/files", body) ==
		fp("multipart/form-data; boundary=b", "/v1/files", body))
	fmt.Println(fp("text/plain; charset=UTF-8", "/v1/notes", "caf\xc3\xa9") ==
		fp("text/plain;charset=utf-8", "/v1/notes", "caf\xc3\xa9"))
	// Output:
	// true
	// false
	// true
	// false
	// true
}

// During a rolling deploy from the release before this one, the new
// instances store and compare the fingerprints the old ones do, so that a
// retry that moves between them is replayed; the default accepts those
// records once the option is gone.
func ExamplePreviousFingerprint() {
	store := new(idemserver.MemoryStore)
	runs := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
	})
	during := (&idemserver.Middleware{Store: store, SingleTenant: true, Fingerprint: idemserver.PreviousFingerprint}).Wrap(charge)
	after := (&idemserver.Middleware{Store: store, SingleTenant: true}).Wrap(charge)
	send := func(h http.Handler) string {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return fmt.Sprintf("%d replayed=%q", w.Code, w.Header().Get(idemserver.ReplayedHeader))
	}
	fmt.Println(send(during))
	fmt.Println(send(after))
	fmt.Println("runs:", runs)
	// Output:
	// 201 replayed=""
	// 201 replayed="true"
	// runs: 1
}

// A response too large to store reaches its client, and its key stays
// completed: a retry gets 410 with the status the handler answered, and
// the handler does not run again.
func ExampleMiddleware_maxStoredBody() {
	var reports atomic.Int64
	mw := &idemserver.Middleware{SingleTenant: true, MaxStoredBody: 1024}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reports.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, strings.Repeat("row\n", 1000))
	}))
	for range 2 {
		r := httptest.NewRequest(http.MethodPost, "/v1/reports", nil)
		r.Header.Set("Idempotency-Key", "report-7")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusGone {
			fmt.Println(w.Code, w.Body.Len(), "bytes")
			continue
		}
		var p idemserver.Problem
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		fmt.Println(w.Code, p.Type == idemserver.TypeNotReplayable, "original status", p.OriginalStatus)
	}
	fmt.Println("runs:", reports.Load())
	// Output:
	// 201 4000 bytes
	// 410 true original status 201
	// runs: 1
}

// A bounded MemoryStore refuses new keys when full, rather than evict a
// live record; the middleware answers 503 with Retry-After.
func ExampleMemoryStore_bounds() {
	var charges atomic.Int64
	store := &idemserver.MemoryStore{MaxEntries: 1}
	mw := &idemserver.Middleware{SingleTenant: true, Store: store, Logger: slog.New(slog.DiscardHandler)}
	h := mw.Wrap(chargeHandler(&charges))
	for _, key := range []string{"k1", "k2", "k1"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%s %d retry-after=%q replayed=%q\n", key, w.Code, w.Header().Get("Retry-After"), w.Header().Get(idemserver.ReplayedHeader))
	}
	// Output:
	// k1 201 retry-after="" replayed=""
	// k2 503 retry-after="1" replayed=""
	// k1 201 retry-after="" replayed="true"
}
