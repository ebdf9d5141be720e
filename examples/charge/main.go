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
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
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

	// Each call's retries, by reason, from the hook: the context carries
	// the call's own list. Calls run one at a time here; a hook must be
	// safe for concurrent use where they do not.
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Timeout: 300 * time.Millisecond}, // per attempt
		Policy: &idemhttp.Policy{
			HonorShouldRetry: true,
			MaxAttempts:      8, // MaxPerOperation 2 faults spoil at most 6 requests (two 409 bursts)
			BaseDelay:        20 * time.Millisecond,
			MaxDelay:         200 * time.Millisecond,
		},
		Hooks: &idemtrace.Hooks{OnRetry: func(ctx context.Context, e idemtrace.RetryEvent) {
			if r, ok := ctx.Value(retriesKey{}).(*[]idemtrace.RetryReason); ok {
				*r = append(*r, e.Reason)
			}
		}},
	}

	ok, failed := 0, 0
	total := map[idemtrace.RetryReason]int{}
	for i := 1; i <= n; i++ {
		op := fmt.Sprintf("order-%04d", i)
		form := url.Values{"amount": {fmt.Sprint(1000 + i)}, "currency": {"usd"}, "metadata[operation]": {op}}
		var retried []idemtrace.RetryReason
		ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), retriesKey{}, &retried), 10*time.Second)
		charge, info, err := createCharge(ctx, c, api.URL, form)
		cancel()
		for _, r := range retried {
			total[r]++
		}
		if err != nil {
			failed++
			var g *idemhttp.GiveUpError
			if errors.As(err, &g) {
				fmt.Fprintf(w, "%s  FAILED after %s (key %s): %v\n", op, plural(g.Attempts, "attempt"), g.Key, g.Reason)
				continue
			}
			fmt.Fprintf(w, "%s  FAILED: %v\n", op, err)
			continue
		}
		ok++
		fmt.Fprintf(w, "%s  %s  %s%s\n", op, charge, plural(info.Attempts, "attempt"), describe(info, retried))
	}

	st := api.Stats()
	fmt.Fprintf(w, "\ncharges: %d ok, %d failed\n", ok, failed)
	fmt.Fprintf(w, "retries by reason: %s\n", counts(total))
	fmt.Fprintf(w, "server: %d requests, %d charges executed, %d replays; faults injected: %s\n", st.Requests, st.Executions, st.Replays, counts(st.Faults))
	fmt.Fprintf(w, "charges executed more than once: %d\n", st.Duplicates)
	if st.Duplicates != 0 {
		return fmt.Errorf("%d duplicate charges", st.Duplicates)
	}
	return nil
}

// retriesKey carries a call's list of retry reasons in its context.
type retriesKey struct{}

// describe says how a charge got through: the retries, and where the
// charge came from when the server replayed it.
func describe(info idemhttp.Info, retried []idemtrace.RetryReason) string {
	var b strings.Builder
	if len(retried) > 0 {
		names := make([]string, len(retried))
		for i, r := range retried {
			names[i] = string(r)
		}
		fmt.Fprintf(&b, " (retried: %s)", strings.Join(names, ", "))
	}
	switch {
	case info.Replayed && info.Attempts > 1:
		b.WriteString("; replayed: an earlier request with the key had made the charge, and its answer was lost")
	case info.Replayed:
		// One attempt, yet a replay: net/http's Transport resent the
		// request by itself (it does so for a request carrying
		// Idempotency-Key when a reused connection dies before the
		// answer), and the request it resent had made the charge.
		b.WriteString("; replayed: net/http resent the request by itself after its connection died, and the first copy had made the charge")
	}
	return b.String()
}

// plural renders n things: "1 attempt", "3 attempts".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// counts renders a tally as "a 3, b 1", non-zero counts only, by name;
// "none" when all are zero.
func counts[K ~string](m map[K]int) string {
	keys := slices.Sorted(maps.Keys(m))
	var parts []string
	for _, k := range keys {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
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
