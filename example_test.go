package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
)

// flaky answers 503 to the first `fail` requests, then 200, and remembers
// the keys it saw.
func flaky(fail int32, keys *[]string) *httptest.Server {
	var n atomic.Int32
	var mu sync.Mutex
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		*keys = append(*keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		if n.Add(1) <= fail {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
}

// The zero Client mints a key before the first attempt and resends it,
// with the same body, on every retry.
func Example() {
	var keys []string
	srv := flaky(2, &keys)
	defer srv.Close()

	var c idemhttp.Client
	req, _ := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":1000,"currency":"usd"}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", len(keys), "same key every time:", keys[0] == keys[1] && keys[1] == keys[2])
	// Output:
	// 200 {"id":"ch_1","status":"succeeded"}
	// attempts: 3 same key every time: true
}

func ExampleClient_Do() {
	var keys []string
	srv := flaky(1, &keys)
	defer srv.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{MaxAttempts: 3, BaseDelay: 10 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/orders", strings.NewReader(`{"sku":"A-1"}`))
	resp, err := c.Do(req)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	resp.Body.Close()
	info, _ := idemhttp.ResponseInfo(resp)
	fmt.Println(resp.StatusCode, "after", info.Attempts, "attempts")
	// Output: 200 after 2 attempts
}

func ExampleNewKey() {
	k := idemhttp.NewKey()
	fmt.Println(len(k), k[14:15]) // a version 4 UUID
	// Output: 36 4
}

// A batch job derives each operation's key from a secret, so a rerun after
// a crash sends the same keys even without a journal.
func ExampleDeriveKey() {
	secret := []byte("batch-secret-0123456789abcdef") // in production: from a secret store
	k, err := idemhttp.DeriveKey(secret, "invoice-2026-0001")
	fmt.Println(k, err)
	// Output: 4e36ec1a-ff48-82e0-8259-78bb0b1a3355 <nil>
}

func ExampleWithKey() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("server saw key:", r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()

	var c idemhttp.Client
	ctx := idemhttp.WithKey(context.Background(), "order-1042-capture")
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
	}
	// Output: server saw key: order-1042-capture
}

// Naming the operation makes a rerun reuse its key; once it is done, a
// rerun sends nothing; the same operation with a different body is refused
// before anything is sent.
func ExampleWithOperation() {
	var keys []string
	srv := flaky(1, &keys) // overloaded once
	defer srv.Close()

	c := idemhttp.Client{Policy: &idemhttp.Policy{MaxAttempts: 1}}
	send := func(body string) error {
		ctx := idemhttp.WithOperation(context.Background(), "order-1042")
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(body))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	fmt.Println(errors.Is(send(`{"amount":1000}`), idemhttp.ErrExhausted)) // the 503: still pending
	fmt.Println(send(`{"amount":1000}`))                                   // the rerun, same key
	fmt.Println("same key:", keys[0] == keys[1])
	fmt.Println(errors.Is(send(`{"amount":1000}`), idemhttp.ErrAlreadyDone)) // done is done
	fmt.Println(errors.Is(send(`{"amount":9999}`), idemhttp.ErrKeyMismatch), "requests sent:", len(keys))
	// Output:
	// true
	// <nil>
	// same key: true
	// true
	// true requests sent: 2
}

// Any SDK that accepts an *http.Client gets keys and safe retries; a key
// the SDK sets itself is kept.
func ExampleClient_StandardClient() {
	var keys []string
	srv := flaky(1, &keys)
	defer srv.Close()

	c := &idemhttp.Client{}
	sdkHTTP := c.StandardClient() // hand this to the SDK
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "sdk-chosen-key")
	resp, err := sdkHTTP.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	fmt.Println(keys)
	// Output: [sdk-chosen-key sdk-chosen-key]
}

func ExampleResponseInfo() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		fmt.Fprint(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()

	var c idemhttp.Client
	ctx := idemhttp.WithKey(context.Background(), "charge-77")
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	resp.Body.Close()
	info, _ := idemhttp.ResponseInfo(resp)
	fmt.Printf("key=%s attempts=%d replayed=%v\n", info.Key, info.Attempts, info.Replayed)
	// Output: key=charge-77 attempts=1 replayed=true
}

func ExampleReplayed() {
	resp := &http.Response{Header: http.Header{"Idempotent-Replayed": {"true"}}}
	fmt.Println(idemhttp.Replayed(resp))
	// Output: true
}

func ExampleGiveUpError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict) // the first attempt never finishes
	}))
	defer srv.Close()

	// A 409 "in progress" is waited out for InProgressPatience (or until
	// the context's deadline), however many attempts that takes.
	c := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond, InProgressPatience: 50 * time.Millisecond}}
	ctx := idemhttp.WithKey(context.Background(), "payout-5")
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	_, err := c.Do(req)
	var g *idemhttp.GiveUpError
	if errors.As(err, &g) {
		fmt.Println(g.Key, g.LastStatus, g.Attempts > 4, errors.Is(err, idemhttp.ErrInProgress))
	}
	// Output: payout-5 409 true true
}

func ExampleKeyMismatchError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`)
	}))
	defer srv.Close()

	var c idemhttp.Client
	ctx := idemhttp.WithKey(context.Background(), "refund-9")
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{"amount":5}`))
	_, err := c.Do(req)
	var m *idemhttp.KeyMismatchError
	if errors.As(err, &m) {
		fmt.Println(m.Key, m.StatusCode, errors.Is(err, idemhttp.ErrKeyMismatch))
	}
	// Output: refund-9 400 true
}

func ExamplePolicy() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("sent", r.Method, r.Header.Get("Idempotency-Key"))
	}))
	defer srv.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{
		MaxAttempts:   6,
		BaseDelay:     100 * time.Millisecond,
		MaxDelay:      5 * time.Second,
		MaxRetryAfter: 30 * time.Second,
		KeyMethods:    []string{"POST", "PATCH", "DELETE"},
		QuoteKey:      true, // IETF draft form: Idempotency-Key: "..."
		Budget:        idemhttp.Budget{Capacity: 100},
	}}
	req, _ := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "order-1"), "DELETE", srv.URL, nil)
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	// Output: sent DELETE "order-1"
}

func ExampleStripePolicy() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Stripe-Should-Retry", "false")
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()

	c := &idemhttp.Client{Policy: idemhttp.StripePolicy()}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{}`))
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	resp.Body.Close()
	info, _ := idemhttp.ResponseInfo(resp)
	fmt.Println(resp.StatusCode, "attempts:", info.Attempts) // the server said not to retry
	// Output: 500 attempts: 1
}

func ExampleClient_Resume() {
	var keys []string
	srv := flaky(2, &keys)
	defer srv.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}}
	ctx := idemhttp.WithOperation(context.Background(), "order-7")
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{"amount":1}`))
	_, err := c.Do(req)
	fmt.Println("first run:", errors.Is(err, idemhttp.ErrExhausted))

	results, _ := c.Resume(context.Background(), nil) // later, once the server is back
	for _, r := range results {
		fmt.Println("resumed", r.Entry.Operation, r.StatusCode, r.Err)
	}
	fmt.Println("same key on resume:", keys[0] == keys[2])
	// Output:
	// first run: true
	// resumed order-7 200 <nil>
	// same key on resume: true
}

// A journal stores what Sanitized leaves of an entry, so that the rules
// for what may rest on disk live in one place.
func ExampleEntry_Sanitized() {
	e := &idemhttp.Entry{
		Key:    "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f",
		Method: http.MethodPost,
		URL:    "https://api.example.com/v1/charges#details",
		Header: http.Header{
			"Content-Type":     {"application/json"},
			"authorization":    {"Bearer sk_live_123"}, // any letter case
			"X-Api-Key":        {"k_live_123"},         // a common API key header
			"X-Partner-Secret": {"p_123"},              // the journal's own secret names
		},
	}
	rec, err := e.Sanitized("X-Partner-Secret")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rec.URL)
	fmt.Println(slices.Sorted(maps.Keys(rec.Header)))
	fmt.Println(rec.State)

	e.URL = "https://sk_live_123:@api.example.com/v1/charges"
	_, err = e.Sanitized()
	fmt.Println(errors.Is(err, idemhttp.ErrInvalidRequest))
	// Output:
	// https://api.example.com/v1/charges
	// [Content-Type]
	// pending
	// true
}

// A journal keeps of an outcome what Sanitized leaves: the headers a
// caller reads, never Set-Cookie, and the URLs they hold without
// credentials, such as a presigned URL's signature.
func ExampleOutcome_Sanitized() {
	o := idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Result: &idemhttp.Result{
		Status: 201,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Set-Cookie":   {"session=abc"},
			"Location":     {"https://bucket.s3.amazonaws.com/up?X-Amz-Credential=AKIA%2F20260301&X-Amz-Signature=9f2c&X-Amz-Expires=300"},
		},
		Body: []byte(`{"id":"up_1"}`),
	}}
	kept, err := o.Sanitized()
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(slices.Sorted(maps.Keys(kept.Result.Header)))
	fmt.Println(kept.Result.Header.Get("Location"))
	// Output:
	// [Content-Type Location]
	// https://bucket.s3.amazonaws.com/up?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED&X-Amz-Expires=300
}

// A batch job parks what the server asks it to wait for: a Retry-After
// beyond MaxRetryAfter keeps the operation pending until the server's
// time, and nothing sends it before then.
func ExampleParkedError() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Retry-After", "3600") // come back in an hour
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()

	c := &idemhttp.Client{} // with a Journal, the park outlives the process
	send := func() error {
		ctx := idemhttp.WithOperation(context.Background(), "export-2026-03")
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{"report":"march"}`))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	err := send()
	var parked *idemhttp.ParkedError
	if errors.As(err, &parked) {
		fmt.Println("parked for", time.Until(parked.NotBefore).Round(time.Hour), errors.Is(err, idemhttp.ErrRetryAfterTooLong))
	}
	err = send() // a rerun before then sends nothing
	fmt.Println(errors.Is(err, idemhttp.ErrParked), "requests:", calls.Load())
	// Output:
	// parked for 1h0m0s true
	// true requests: 1
}
