package idemtrace_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtrace"
)

// flaky answers 503 to the first fail requests, then 200.
func flaky(fail int32) *httptest.Server {
	var n atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= fail {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, `{"id":"ch_1","status":"succeeded"}`)
	}))
}

// Hooks see every decision of a call, in order, on the call's goroutine.
func ExampleHooks() {
	srv := flaky(2)
	defer srv.Close()

	c := &idemhttp.Client{Hooks: &idemtrace.Hooks{
		OnAttemptDone: func(_ context.Context, ev idemtrace.AttemptDoneEvent) {
			fmt.Printf("attempt %d: status %d\n", ev.Attempt, ev.Status)
		},
		OnRetry: func(_ context.Context, ev idemtrace.RetryEvent) {
			fmt.Printf("retry: %s\n", ev.Reason)
		},
		OnCallDone: func(_ context.Context, ev idemtrace.CallDoneEvent) {
			fmt.Printf("done: status %d after %d attempts\n", ev.Status, ev.Attempts)
		},
	}}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":1000}`))
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	// Output:
	// attempt 1: status 503
	// retry: unavailable
	// attempt 2: status 503
	// retry: unavailable
	// attempt 3: status 200
	// done: status 200 after 3 attempts
}
