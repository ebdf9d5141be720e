//go:build ignore

// Command golden writes the PostgreSQL journal's golden data: run in a
// worktree of commit 2d053bb (the previous release), it migrates a new
// schema with that commit's Migrate, takes a batch of operations into
// every state through that commit's Journal and Client, and prints the
// schema's name; baseline.sh then dumps its idemhttp_journal table.
//
//	go run testdata/golden/main.go
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/contrib/postgres"
)

// origin is the API every entry names.
const origin = "http://api.golden.example"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "golden:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	url := os.Getenv("IDEMHTTP_POSTGRES_URL")
	if url == "" {
		return errors.New("IDEMHTTP_POSTGRES_URL is not set")
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "idemhttp_golden_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer admin.Close()
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil {
		return err
	}

	// The server: its answer is chosen by the body's "do" field.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), `"do":"201"`):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ch_golden_1"}`)
		case strings.Contains(string(body), `"do":"402"`):
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = io.WriteString(w, `{"error":{"type":"card_error"}}`)
		case strings.Contains(string(body), `"do":"stored500"`):
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"type":"api_error"}}`)
		default:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	j := postgres.NewJournal(pool, &postgres.JournalOptions{Worker: "golden-a", SecretHeaders: []string{"X-Api-Key"}})
	// Every request goes to srv, whatever its host, so that the dump's
	// URLs do not name a port of the run that made it.
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Transport: &http.Transport{DialContext: dial}},
		Journal:    j,
		Policy:     &idemhttp.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
	}
	do := func(op, do string, header http.Header) error {
		req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, op), http.MethodPost, origin+"/v1/charges?currency=usd",
			strings.NewReader(`{"amount":100,"do":"`+do+`","op":"`+op+`"}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	// Through the Client: done with 201, done with 402, done with a
	// replayed 500, pending after 503s (the lease kept).
	if err := do("op-done-201", "201", http.Header{"Stripe-Version": {"2024-06-20"}, "X-Api-Key": {"sk_golden_secret"}, "X-Multi": {"one", "two"}}); err != nil {
		return err
	}
	if err := do("op-done-402", "402", nil); err != nil {
		return err
	}
	if err := do("op-done-stored-500", "stored500", nil); err != nil {
		return err
	}
	if err := do("op-pending-503", "503", nil); !errors.Is(err, idemhttp.ErrExhausted) {
		return fmt.Errorf("op-pending-503: %v", err)
	}
	// A call without an operation id, done.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, origin+"/v1/charges", strings.NewReader(`{"do":"201","op":"none"}`))
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()

	// Directly: an entry a killed worker left (leased, no attempt
	// recorded), entries enqueued for the fleet (never leased; one with an
	// empty body, one without an operation id), an abandoned one, a
	// deleted one (absent from the dump).
	entry := func(key, op, body string) *idemhttp.Entry {
		u := origin + "/v1/charges"
		return &idemhttp.Entry{
			Operation: op, Key: key, Method: http.MethodPost, URL: u,
			Header:      http.Header{"Content-Type": {"application/json"}},
			Body:        []byte(body),
			Fingerprint: idemhttp.Fingerprint(http.MethodPost, u, []byte(body)),
			State:       idemhttp.StatePending,
		}
	}
	if _, err := j.Begin(ctx, entry("11111111-1111-4111-8111-111111111111", "op-pending-killed", `{"do":"201","op":"op-pending-killed"}`)); err != nil {
		return err
	}
	if _, err := j.Enqueue(ctx, entry("22222222-2222-4222-8222-222222222222", "op-enqueued", `{"do":"201","op":"op-enqueued"}`)); err != nil {
		return err
	}
	if _, err := j.Enqueue(ctx, entry("33333333-3333-4333-8333-333333333333", "op-enqueued-empty", "")); err != nil {
		return err
	}
	if _, err := j.Enqueue(ctx, entry("44444444-4444-4444-8444-444444444444", "", `{"do":"201","op":"no-operation"}`)); err != nil {
		return err
	}
	if _, err := j.Begin(ctx, entry("55555555-5555-4555-8555-555555555555", "op-abandoned", `{"do":"201","op":"op-abandoned"}`)); err != nil {
		return err
	}
	if err := j.Finish(ctx, "55555555-5555-4555-8555-555555555555", idemhttp.Outcome{State: idemhttp.StateAbandoned, Status: 503, Attempts: 4}); err != nil {
		return err
	}
	if _, err := j.Begin(ctx, entry("66666666-6666-4666-8666-666666666666", "op-deleted", `{"do":"201"}`)); err != nil {
		return err
	}
	if err := j.Delete(ctx, "66666666-6666-4666-8666-666666666666"); err != nil {
		return err
	}
	fmt.Println(schema)
	return nil
}
