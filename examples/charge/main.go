// Command charge sends Stripe-style charges through idemhttp to a local
// fake payments API (idemtest) that loses requests, loses responses after
// committing them, answers slowly, and sheds load with 503 and 409, then
// shows that every charge ran exactly once.
//
//	go run ./examples/charge
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/idemkit/idemhttp/idemtrace"
)

func main() {
	n := flag.Int("n", 20, "charges to send")
	seed := flag.Uint64("seed", 1, "fault seed")
	flag.Parse()
	if err := run(os.Stdout, *n, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "charge:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, n int, seed uint64) error {
	api := idemtest.NewServer(&idemtest.Options{
		StripeErrors: true,
		Faults: idemtest.Faults{
			Seed:            seed,
			DropRequest:     0.15,
			DropResponse:    0.15,
			Slow:            0.05,
			SlowDelay:       time.Second,
			Unavailable:     0.10,
			Conflict:        0.05,
			MaxPerOperation: 2,
		},
	})
	defer api.Close()

	retries := map[idemtrace.RetryReason]int{}
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Timeout: 300 * time.Millisecond}, // per attempt
		Policy: &idemhttp.Policy{
			HonorShouldRetry: true,
			MaxAttempts:      8, // MaxPerOperation 2 faults spoil at most 6 requests (two 409 bursts)
			BaseDelay:        20 * time.Millisecond,
			MaxDelay:         200 * time.Millisecond,
		},
		Hooks: &idemtrace.Hooks{OnRetry: func(_ context.Context, e idemtrace.RetryEvent) { retries[e.Reason]++ }},
	}

	ok, failed := 0, 0
	for i := 1; i <= n; i++ {
		op := fmt.Sprintf("order-%04d", i)
		form := url.Values{"amount": {fmt.Sprint(1000 + i)}, "currency": {"usd"}, "metadata[operation]": {op}}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		charge, info, err := createCharge(ctx, c, api.URL, form)
		cancel()
		if err != nil {
			failed++
			var g *idemhttp.GiveUpError
			if errors.As(err, &g) {
				fmt.Fprintf(w, "%s  FAILED after %d attempts (key %s): %v\n", op, g.Attempts, g.Key, g.Reason)
				continue
			}
			fmt.Fprintf(w, "%s  FAILED: %v\n", op, err)
			continue
		}
		ok++
		replay := ""
		if info.Replayed {
			replay = "  (replayed: the first attempt had committed)"
		}
		fmt.Fprintf(w, "%s  %s  %d attempt(s)  key %s%s\n", op, charge, info.Attempts, info.Key, replay)
	}

	st := api.Stats()
	fmt.Fprintf(w, "\ncharges ok: %d, failed: %d\n", ok, failed)
	fmt.Fprintf(w, "retries by reason: %v\n", retries)
	fmt.Fprintf(w, "server: %d requests, %d executions, %d replays, faults %v\n", st.Requests, st.Executions, st.Replays, st.Faults)
	fmt.Fprintf(w, "charges executed more than once: %d\n", st.Duplicates)
	if st.Duplicates != 0 {
		return fmt.Errorf("%d duplicate charges", st.Duplicates)
	}
	return nil
}

// createCharge posts one charge and returns its id.
func createCharge(ctx context.Context, c *idemhttp.Client, base string, form url.Values) (string, idemhttp.Info, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/charges", strings.NewReader(form.Encode()))
	if err != nil {
		return "", idemhttp.Info{}, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer sk_test_example")
	resp, err := c.Do(req)
	if err != nil {
		return "", idemhttp.Info{}, err
	}
	defer resp.Body.Close()
	info, _ := idemhttp.ResponseInfo(resp)
	var charge struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&charge); err != nil || resp.StatusCode != http.StatusOK {
		return "", info, fmt.Errorf("status %d: %v", resp.StatusCode, err)
	}
	return charge.ID, info, nil
}
