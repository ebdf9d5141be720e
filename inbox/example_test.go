package inbox_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/inbox"
)

// A consumer whose effect is an HTTP call needs no inbox table: it derives
// the call's idempotency key from the message, so a redelivery (here, the
// same message delivered three times) sends the same key and the server
// replays instead of charging again. Ack after the call succeeds.
func ExampleDeriveKey() {
	api := idemtest.NewServer(nil) // a Stripe-style API that dedups by key
	defer api.Close()
	client := &idemhttp.Client{HTTPClient: api.Client()}
	secret := []byte("a secret of at least 16 bytes, from your vault")

	handle := func(ctx context.Context, m *inbox.Message) error {
		key, err := inbox.DeriveKey(secret, "charger", m.ID)
		if err != nil {
			return err // ErrNoMessageID: do not ack
		}
		req, err := http.NewRequestWithContext(idemhttp.WithKey(ctx, key), http.MethodPost,
			api.URL+"/v1/charges", strings.NewReader(string(m.Body)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err // not acked: redelivered, same key
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("charge: %s", resp.Status)
		}
		fmt.Println("charged, replayed:", idemhttp.Replayed(resp))
		return nil
	}

	m := &inbox.Message{ID: "order-42", Body: []byte(`{"amount":2000,"currency":"usd","operation":"order-42"}`)}
	for range 3 {
		if err := handle(context.Background(), m); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println("order-42 charged:", api.Executions("order-42"))
	// Output:
	// charged, replayed: false
	// charged, replayed: true
	// charged, replayed: true
	// order-42 charged: 1
}
