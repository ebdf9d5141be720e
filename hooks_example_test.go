package idemhttp_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
)

// An API that says in its error bodies whether a retry can help teaches
// the client its dialect with Policy.Classify.
func ExamplePolicy_classify() {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"ledger busy","retryable":true}`)
			return
		}
		fmt.Fprint(w, `{"id":"tr_1"}`)
	}))
	defer srv.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{
		BaseDelay: 10 * time.Millisecond,
		Classify: func(resp *http.Response, err error) idemhttp.Verdict {
			if resp != nil && resp.StatusCode >= 400 && bytes.Contains(idemhttp.PeekBody(resp), []byte(`"retryable":true`)) {
				return idemhttp.VerdictRetry
			}
			return idemhttp.VerdictDefault // the built-in rules decide
		},
	}}
	req, _ := http.NewRequest("POST", srv.URL+"/v1/transfers", strings.NewReader(`{"amount":5}`))
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

// One call may need fewer attempts than the policy's, or a shorter wait
// for a duplicate in progress.
func ExampleWithAttempts() {
	var keys []string
	srv := flaky(5, &keys)
	defer srv.Close()

	var c idemhttp.Client
	ctx := idemhttp.WithAttempts(context.Background(), 1) // no retries for this call
	ctx = idemhttp.WithInProgressPatience(ctx, 2*time.Second)
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
	_, err := c.Do(req)
	fmt.Println(err != nil, len(keys))
	// Output: true 1
}

// Stats feed a health check: a drained retry budget means the servers
// behind the client are failing.
func ExampleClient_Stats() {
	c := &idemhttp.Client{}
	s := c.Stats()
	fmt.Printf("budget %d/%d, in flight %d, pending %d\n", s.BudgetTokens, s.BudgetCapacity, s.InFlight, s.JournalPending)
	// Output: budget 500/500, in flight 0, pending 0
}
