package idemtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
)

// postCharge sends a charge for op with key through c and describes the
// answer, or says the connection failed.
func postCharge(c *http.Client, url, key, op string) string {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/charges", strings.NewReader(fmt.Sprintf(`{"amount":2000,"currency":"usd","operation":%q}`, op)))
	if err != nil {
		return err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return "no reply"
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return fmt.Sprintf("%d replayed=%s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
}

// The server counts each operation's side effects; a retry with the same
// key is replayed instead of charging again.
func ExampleNewServer() {
	srv := idemtest.NewServer(nil)
	defer srv.Close()

	fmt.Println(postCharge(srv.Client(), srv.URL, "key-1", "order-1"))
	fmt.Println(postCharge(srv.Client(), srv.URL, "key-1", "order-1"))
	fmt.Println("order-1 executed:", srv.Executions("order-1"))
	// Output:
	// 200 replayed=
	// 200 replayed=true
	// order-1 executed: 1
}

// A dropped response is the hard case: the charge was made but the client
// never heard. Retrying with the same key gets the stored reply.
func ExampleFaults() {
	srv := idemtest.NewServer(&idemtest.Options{
		Faults: idemtest.Faults{DropResponse: 1, MaxPerOperation: 1},
	})
	defer srv.Close()
	c := srv.Client()
	c.Transport.(*http.Transport).DisableKeepAlives = true // no silent resend by net/http

	fmt.Println(postCharge(c, srv.URL, "key-1", "order-1"))
	fmt.Println("executed:", srv.Executions("order-1"))
	fmt.Println(postCharge(c, srv.URL, "key-1", "order-1"))
	fmt.Println("executed:", srv.Executions("order-1"))
	// Output:
	// no reply
	// executed: 1
	// 200 replayed=true
	// executed: 1
}

// idemhttp.Client against a server that drops requests and responses and
// sheds load: every operation runs exactly once.
func ExampleServer_client() {
	srv := idemtest.NewServer(&idemtest.Options{
		Faults: idemtest.Faults{Seed: 1, DropRequest: 0.2, DropResponse: 0.2, Unavailable: 0.2, MaxPerOperation: 2},
	})
	defer srv.Close()
	c := &idemhttp.Client{
		HTTPClient: srv.Client(),
		Policy:     &idemhttp.Policy{BaseDelay: time.Millisecond, MaxAttempts: 5},
	}
	for i := range 20 {
		body := fmt.Sprintf(`{"amount":100,"currency":"usd","operation":"order-%d"}`, i)
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			fmt.Println(err)
			continue
		}
		resp.Body.Close()
	}
	st := srv.Stats()
	fmt.Println("operations:", st.Operations, "executions:", st.Executions, "duplicates:", st.Duplicates)
	// Output:
	// operations: 20 executions: 20 duplicates: 0
}

// Stripe's dialect: a reused key is a 400 idempotency_error, with
// Stripe-Should-Retry telling clients not to retry.
func ExampleOptions_stripeErrors() {
	srv := idemtest.NewServer(&idemtest.Options{StripeErrors: true})
	defer srv.Close()
	postCharge(srv.Client(), srv.URL, "key-1", "order-1")

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":999,"currency":"usd"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "key-1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Type, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.StatusCode, resp.Header.Get("Stripe-Should-Retry"), e.Error.Type)
	fmt.Println(e.Error.Message)
	// Output:
	// 400 false idempotency_error
	// Idempotency-Key is already used: This key was first used with a different request (method, path, query or body); a key must not be reused for another request.
}

// Operation finds the operation a request body names, in JSON or in a
// form as stripe-go sends it.
func ExampleOperation() {
	fmt.Println(idemtest.Operation("application/json", []byte(`{"operation":"order-7","amount":100}`)))
	fmt.Println(idemtest.Operation("application/x-www-form-urlencoded", []byte("amount=100&metadata[operation]=order-8")))
	// Output:
	// order-7
	// order-8
}

// Stats prints on one line, for demos and benchmark reports.
func ExampleStats() {
	srv := idemtest.NewServer(nil)
	defer srv.Close()
	postCharge(srv.Client(), srv.URL, "key-1", "order-1")
	postCharge(srv.Client(), srv.URL, "key-1", "order-1")
	fmt.Println(srv.Stats())
	// Output:
	// requests=2 executions=1 operations=1 duplicates=0 replays=1 conflicts=0 mismatches=0 drop-request=0 drop-response=0 slow=0 unavailable=0 conflict=0 stored-500=0 outage=0 rate-limited=0
}
