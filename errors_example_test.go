package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
)

// A client that gives up on a final status hands back the last response's
// status, headers and body in the *GiveUpError, already read: the caller
// parses the API's own error document from it, as it would from the
// response, with the connection long gone. A Set-Cookie never reaches the
// error, and a signed URL in a header loses its signature.
func ExampleGiveUpError_lastResponse() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_8Hq2")
		w.Header().Set("Set-Cookie", "lb=node-3")
		w.Header().Set("Link", `<https://status.example.com/incidents/42?sig=s3cr3t>; rel="help"`)
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `{"error":{"type":"api_error","code":"maintenance","message":"Charges are paused for maintenance."}}`)
	}))
	defer srv.Close()

	c := &idemhttp.Client{Policy: &idemhttp.Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}}
	req, _ := http.NewRequestWithContext(context.Background(), "POST", srv.URL+"/v1/charges", strings.NewReader(`{"amount":1000}`))
	_, err := c.Do(req)

	var g *idemhttp.GiveUpError
	if !errors.As(err, &g) {
		fmt.Println("unexpected:", err)
		return
	}
	var apiErr struct {
		Error struct{ Type, Code, Message string }
	}
	if g.Header.Get("Content-Type") == "application/json" && json.Unmarshal(g.Body, &apiErr) == nil {
		fmt.Printf("%d %s: %s (request %s)\n", g.LastStatus, apiErr.Error.Code, apiErr.Error.Message, g.Header.Get("Request-Id"))
	}
	fmt.Println("cookie kept:", g.Header.Get("Set-Cookie") != "")
	fmt.Println(g.Header.Get("Link"))
	// Output:
	// 503 maintenance: Charges are paused for maintenance. (request req_8Hq2)
	// cookie kept: false
	// <https://status.example.com/incidents/42?sig=REDACTED>; rel="help"
}

// An operation rerun after its base URL changed: the journal (here the
// client's memory, which WithOperation uses without a Journal) holds the
// operation's first request, sent to the old host, so the rerun is
// refused before anything is sent, and the error says what differs.
func ExampleKeyMismatchError_rerun() {
	var c idemhttp.Client
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"id":"ch_1"}`)
	}))
	defer srv.Close()
	ctx := idemhttp.WithOperation(context.Background(), "order-42")
	send := func(base string) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/charges", strings.NewReader(`{"amount":1000}`))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	_ = send(srv.URL) // the first run

	err := send("https://payments.example.com") // the rerun, configured anew
	var m *idemhttp.KeyMismatchError
	if errors.As(err, &m) {
		fmt.Println(m.Differs)
		fmt.Println(strings.Replace(m.Journaled, srv.URL, "http://127.0.0.1:PORT", 1))
		fmt.Println(m.Request)
	}
	// Output:
	// [origin]
	// POST http://127.0.0.1:PORT/v1/charges
	// POST https://payments.example.com/v1/charges
}
