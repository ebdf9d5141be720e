package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/stripe/stripe-go/v82"
)

// stripeFake answers /v1/charges like Stripe: 503 for the first `fail`
// requests (or, with drop, closes their connections without an answer),
// then a charge object, recording every key and body it saw.
type stripeFake struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
	fail   int
	drop   bool                        // fail by closing the connection, not with a 503
	answer func(w http.ResponseWriter) // overrides the success answer
}

func (f *stripeFake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.keys = append(f.keys, r.Header.Get("Idempotency-Key"))
	f.bodies = append(f.bodies, string(b))
	n := len(f.keys)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if n <= f.fail && f.drop {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	if n <= f.fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"type":"api_error","message":"overloaded"}}`)
		return
	}
	if f.answer != nil {
		f.answer(w)
		return
	}
	_, _ = io.WriteString(w, `{"id":"ch_123","object":"charge","amount":1000,"currency":"usd","status":"succeeded"}`)
}

func (f *stripeFake) seen() ([]string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...), append([]string(nil), f.bodies...)
}

// newStripe returns a stripe-go v82 client whose own retries are off and
// whose HTTP goes through idem.
func newStripe(url string, idem *idemhttp.Client) *stripe.Client {
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:        idem.StandardClient(),
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_123", stripe.WithBackends(backends))
}

func chargeParams() *stripe.ChargeCreateParams {
	return &stripe.ChargeCreateParams{Amount: stripe.Int64(1000), Currency: stripe.String("usd"), Description: stripe.String("order 1042")}
}

// stripe-go sets its own Idempotency-Key on every POST; idemhttp keeps it
// and resends it, with the same form body, on every retry.
func TestStripeGoKeyIsKeptAcrossRetries(t *testing.T) {
	fake := &stripeFake{fail: 2}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	idem := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
	sc := newStripe(srv.URL, idem)

	params := chargeParams()
	params.IdempotencyKey = stripe.String("order-1042")
	ch, err := sc.V1Charges.Create(context.Background(), params)
	require.NoError(t, err)
	assert.Equal(t, "ch_123", ch.ID)

	keys, bodies := fake.seen()
	require.Len(t, keys, 3)
	for i := range keys {
		assert.Equal(t, "order-1042", keys[i])
		assert.Equal(t, bodies[0], bodies[i])
	}
	assert.Contains(t, bodies[0], "amount=1000")
}

func TestStripeGoGeneratedKeyIsKept(t *testing.T) {
	fake := &stripeFake{fail: 1}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	idem := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond}}
	_, err := newStripe(srv.URL, idem).V1Charges.Create(context.Background(), chargeParams())
	require.NoError(t, err)
	keys, _ := fake.seen()
	require.Len(t, keys, 2)
	assert.NotEmpty(t, keys[0])
	assert.Equal(t, keys[0], keys[1], "the key stripe-go generated is resent, not replaced")
}

// Stripe's idempotency_error reaches the stripe-go caller as stripe-go's
// own error, parsed from the response idemhttp hands it (a call that gives
// up on a final status returns the last response through StandardClient),
// never as a retry.
func TestStripeGoIdempotencyErrorIsTyped(t *testing.T) {
	fake := &stripeFake{answer: func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`)
	}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	var idem idemhttp.Client
	_, err := newStripe(srv.URL, &idem).V1Charges.Create(context.Background(), chargeParams())
	require.Error(t, err)
	var se *stripe.Error
	require.ErrorAs(t, err, &se)
	assert.Equal(t, stripe.ErrorTypeIdempotency, se.Type)
	assert.Equal(t, http.StatusBadRequest, se.HTTPStatusCode)
	keys, _ := fake.seen()
	assert.Len(t, keys, 1)
}

// An SDK that retries by itself multiplies attempts where it sees an
// error: stripe-go's default of 2 network retries, each a whole idemhttp
// call of up to 4 attempts, sends 12 requests for one charge when every
// connection dies (its retries bypass idemhttp's budget and deadline
// rules); with MaxNetworkRetries 0 (as StandardClient's doc says to set)
// the same charge costs the Policy's 4. On a status (503s), idemhttp hands
// stripe-go the last response, which stripe-go does not retry: 4 either
// way.
func TestStripeGoDefaultRetriesMultiplyAttempts(t *testing.T) {
	count := func(t *testing.T, drop bool, retries *int64) int {
		fake := &stripeFake{fail: 1 << 30, drop: drop}
		srv := httptest.NewServer(fake)
		defer srv.Close()
		idem := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond}}
		cfg := &stripe.BackendConfig{
			HTTPClient:    idem.StandardClient(),
			URL:           stripe.String(srv.URL),
			LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
		}
		if retries != nil {
			cfg.MaxNetworkRetries = retries
		}
		sc := stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(cfg)))
		_, err := sc.V1Charges.Create(context.Background(), chargeParams())
		require.Error(t, err)
		keys, _ := fake.seen()
		for _, k := range keys {
			assert.Equal(t, keys[0], k, "one key for the whole charge")
		}
		return len(keys)
	}
	tests := []struct {
		name           string
		drop           bool
		wantSDK        int // stripe-go's default retries
		wantRetriesOff int
	}{
		{"connections dropped", true, 12, 4},
		{"503s", false, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sdkDefault := count(t, tt.drop, nil)
			retriesOff := count(t, tt.drop, stripe.Int64(0))
			t.Logf("requests for one charge, %s: stripe-go defaults %d, MaxNetworkRetries 0: %d", tt.name, sdkDefault, retriesOff)
			assert.Equal(t, tt.wantSDK, sdkDefault)
			assert.Equal(t, tt.wantRetriesOff, retriesOff)
		})
	}
}
