package idemserver_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
)

// post sends body to url with an idempotency key (none if key is empty) and
// an optional tenant header, and describes the answer on one line.
func post(c *http.Client, url, key, tenant, body string) string {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err.Error()
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d replayed=%t %s", resp.StatusCode, resp.Header.Get(idemserver.ReplayedHeader) == "true", b)
}

// chargeHandler creates a charge per call, counting them.
func chargeHandler(charges *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","tenant":%q}`, n, r.Header.Get("X-Tenant"))
	})
}

// A retry with the same key gets the stored response back, and the charge
// is made once.
func ExampleMiddleware() {
	var charges atomic.Int64
	mw := &idemserver.Middleware{SingleTenant: true}
	srv := httptest.NewServer(mw.Wrap(chargeHandler(&charges)))
	defer srv.Close()

	fmt.Println(post(srv.Client(), srv.URL, "order-42", "", `{"amount":100}`))
	fmt.Println(post(srv.Client(), srv.URL, "order-42", "", `{"amount":100}`))
	fmt.Println("charges made:", charges.Load())
	// Output:
	// 201 replayed=false {"id":"ch_1","tenant":""}
	// 201 replayed=true {"id":"ch_1","tenant":""}
	// charges made: 1
}

// With Required set, a POST without a key is refused with the IETF draft's
// problem, which clients recognise by its type URI.
func ExampleMiddleware_required() {
	var charges atomic.Int64
	mw := &idemserver.Middleware{SingleTenant: true, Required: true}
	srv := httptest.NewServer(mw.Wrap(chargeHandler(&charges)))
	defer srv.Close()

	fmt.Println(post(srv.Client(), srv.URL, "", "", `{"amount":100}`))
	// Output:
	// 400 replayed=false {"type":"https://pkg.go.dev/github.com/idemkit/idemhttp/idemserver#TypeKeyMissing","title":"Idempotency-Key is missing","status":400,"detail":"This operation requires an Idempotency-Key header; send a unique key and reuse it on every retry."}
}

// Reusing a key for a different request is a client bug: 422, and the
// handler does not run.
func ExampleMiddleware_mismatch() {
	var charges atomic.Int64
	mw := &idemserver.Middleware{SingleTenant: true}
	srv := httptest.NewServer(mw.Wrap(chargeHandler(&charges)))
	defer srv.Close()

	post(srv.Client(), srv.URL, "order-42", "", `{"amount":100}`)
	fmt.Println(post(srv.Client(), srv.URL, "order-42", "", `{"amount":999}`)[:3])
	fmt.Println("charges made:", charges.Load())
	// Output:
	// 422
	// charges made: 1
}

// Keys are scoped by the principal: two tenants using the same key get
// their own charges and never see each other's response.
func ExampleMiddleware_principal() {
	var charges atomic.Int64
	mw := &idemserver.Middleware{
		Principal: func(r *http.Request) string { return r.Header.Get("X-Tenant") },
	}
	srv := httptest.NewServer(mw.Wrap(chargeHandler(&charges)))
	defer srv.Close()

	fmt.Println(post(srv.Client(), srv.URL, "key-1", "acme", `{}`))
	fmt.Println(post(srv.Client(), srv.URL, "key-1", "globex", `{}`))
	fmt.Println(post(srv.Client(), srv.URL, "key-1", "acme", `{}`))
	// Output:
	// 201 replayed=false {"id":"ch_1","tenant":"acme"}
	// 201 replayed=false {"id":"ch_2","tenant":"globex"}
	// 201 replayed=true {"id":"ch_1","tenant":"acme"}
}

// A custom WriteError renders errors the way an existing API does (here
// Stripe's error object) and leaves the rest to WriteProblem.
func ExampleMiddleware_writeError() {
	var charges atomic.Int64
	mw := &idemserver.Middleware{
		SingleTenant: true,
		WriteError: func(w http.ResponseWriter, _ *http.Request, p *idemserver.Problem) {
			if p.Type != idemserver.TypeKeyMismatch {
				idemserver.WriteProblem(w, p)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":{"type":"idempotency_error"}}`)
		},
	}
	srv := httptest.NewServer(mw.Wrap(chargeHandler(&charges)))
	defer srv.Close()

	post(srv.Client(), srv.URL, "order-42", "", `{"amount":100}`)
	fmt.Println(post(srv.Client(), srv.URL, "order-42", "", `{"amount":999}`))
	// Output:
	// 400 replayed=false {"error":{"type":"idempotency_error"}}
}

// A MemoryStore with an injected clock shows the lifecycle of a key without
// waiting: claimed, completed and replayed, then forgotten after its TTL.
func ExampleMemoryStore() {
	ctx := context.Background()
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &idemserver.MemoryStore{Now: func() time.Time { return now }}
	claim := idemserver.Claim{Token: "t1", Fingerprint: "fp", LockTimeout: time.Minute}

	res, _ := s.Claim(ctx, "key", claim)
	fmt.Println(res.State)
	res, _ = s.Claim(ctx, "key", idemserver.Claim{Token: "t2", Fingerprint: "fp", LockTimeout: time.Minute})
	fmt.Println(res.State)
	record, _ := (&idemserver.Response{Status: 201, Body: []byte("done")}).MarshalBinary()
	_ = s.Complete(ctx, "key", "t1", record, 24*time.Hour)
	res, _ = s.Claim(ctx, "key", claim)
	var stored idemserver.Response
	_ = stored.UnmarshalBinary(res.Record)
	fmt.Println(res.State, stored.Status, string(stored.Body))

	now = now.Add(25 * time.Hour)
	res, _ = s.Claim(ctx, "key", claim)
	fmt.Println(res.State, "again after the TTL")
	// Output:
	// claimed
	// in progress
	// completed 201 done
	// claimed again after the TTL
}

// DefaultShouldStore keeps the outcomes a retry would get again and
// releases the key on the others.
func ExampleDefaultShouldStore() {
	for _, status := range []int{201, 402, 409, 429, 500, 503} {
		fmt.Println(status, idemserver.DefaultShouldStore(status))
	}
	// Output:
	// 201 true
	// 402 true
	// 409 false
	// 429 false
	// 500 false
	// 503 false
}
