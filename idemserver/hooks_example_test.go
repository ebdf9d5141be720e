package idemserver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idemhttp/idemserver"
)

// Hooks see each decision: a new claim and its stored response, then a
// replay and a reuse of the key with another body. Neither the tenant nor
// the key is in the events unless RecordScope and RecordKey say so.
func ExampleHooks() {
	hooks := &idemserver.Hooks{
		RecordKey: true,
		OnClaim: func(_ context.Context, ev idemserver.ClaimEvent) {
			fmt.Printf("claim %s %s key=%s: %s, status %d\n", ev.Method, ev.Path, ev.Key, ev.Outcome, ev.Status)
		},
		OnStored: func(_ context.Context, ev idemserver.StoredEvent) {
			fmt.Printf("stored %s %s: status %d\n", ev.Method, ev.Path, ev.Status)
		},
		OnReleased: func(_ context.Context, ev idemserver.ReleasedEvent) {
			fmt.Printf("released %s %s: %s\n", ev.Method, ev.Path, ev.Reason)
		},
	}
	var charges atomic.Int64
	mw := &idemserver.Middleware{Principal: func(r *http.Request) string { return r.Header.Get("X-Tenant") }, Hooks: hooks}
	h := mw.Wrap(chargeHandler(&charges))

	for _, body := range []string{`{"amount":100}`, `{"amount":100}`, `{"amount":999}`} {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "order-42")
		r.Header.Set("X-Tenant", "acme")
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	// Output:
	// claim POST /v1/charges key=order-42: new, status 0
	// stored POST /v1/charges: status 201
	// claim POST /v1/charges key=order-42: replay, status 201
	// claim POST /v1/charges key=order-42: mismatch, status 422
}
