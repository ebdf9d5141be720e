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

// Two queues carry a message "42" each: they are different messages, and
// their keys differ. Adapters set IDSpace to the queue a message came
// from.
func ExampleDeriveMessageKey() {
	secret := []byte("a secret of at least 16 bytes, from your vault")
	a, _ := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "42", IDSpace: "orders"})
	b, _ := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "42", IDSpace: "refunds"})
	again, _ := inbox.DeriveMessageKey(secret, "charger", &inbox.Message{ID: "42", IDSpace: "orders", Redelivered: true})
	fmt.Println("orders and refunds share a key:", a == b)
	fmt.Println("a redelivery gets the same key:", a == again)
	// Output:
	// orders and refunds share a key: false
	// a redelivery gets the same key: true
}

// The default redelivery schedule of a message whose handler fails: the
// delay doubles, and the fifth failed delivery dead-letters it.
func ExampleRetry() {
	var r inbox.Retry // the defaults
	for n := 1; ; n++ {
		if r.Exhausted(n) {
			fmt.Printf("delivery %d failed: dead-lettered\n", n)
			break
		}
		fmt.Printf("delivery %d failed: again in %v\n", n, r.After(n))
	}
	// Output:
	// delivery 1 failed: again in 1s
	// delivery 2 failed: again in 2s
	// delivery 3 failed: again in 4s
	// delivery 4 failed: again in 8s
	// delivery 5 failed: dead-lettered
}
