package bench_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stripe/stripe-go/v82"
)

// Calling Stripe through idemhttp: stripe-go gets the client from
// StandardClient, and its own retries are turned off, so that idemhttp's
// Policy alone decides what is retried (same key, same body, within the
// deadline and the retry budget).
func Example_stripeGo() {
	var n atomic.Int32 // a fake Stripe that is overloaded once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"type":"api_error","message":"overloaded"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge","amount":1000,"currency":"usd","status":"succeeded"}`)
	}))
	defer srv.Close()

	idem := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
	sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:        idem.StandardClient(),
		MaxNetworkRetries: stripe.Int64(0), // idemhttp retries; two retry layers multiply attempts
		URL:               stripe.String(srv.URL),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	ch, err := sc.V1Charges.Create(context.Background(), &stripe.ChargeCreateParams{Amount: stripe.Int64(1000), Currency: stripe.String("usd")})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ch.ID, ch.Status, n.Load(), "requests")
	// Output: ch_1 succeeded 2 requests
}
