package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startServe runs idemctl serve in-process with args and returns its URL,
// a reader of its further stdout lines, and a function that stops it (as
// SIGINT would) and returns its exit code.
func startServe(t *testing.T, args ...string) (string, *bufio.Scanner, func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	var stderr lockedBuffer
	codec := make(chan int, 1)
	go func() {
		code := run(ctx, append([]string{"serve", "-json"}, args...), env{
			stdin: strings.NewReader(""), stdout: pw, stderr: &stderr,
			getenv: func(string) string { return "" }, isTerminal: func(io.Writer) bool { return false },
		})
		pw.Close()
		codec <- code
	}()
	sc := bufio.NewScanner(pr)
	require.True(t, sc.Scan(), "serve printed nothing: %s", stderr.String())
	var first struct{ URL string }
	require.NoError(t, json.Unmarshal(sc.Bytes(), &first), sc.Text())
	require.NotEmpty(t, first.URL)
	var code int
	var stopped bool
	stop := func() int {
		if !stopped {
			stopped = true
			cancel()
			// Drain until serve exits, keeping the lines for the caller.
			code = <-codec
		}
		return code
	}
	t.Cleanup(func() {
		if !stopped {
			cancel()
			go io.Copy(io.Discard, pr) //nolint:errcheck // unblock the writer
			<-codec
		}
	})
	return first.URL, sc, stop
}

// collect reads the rest of serve's stdout in the background; call the
// returned function after stopping serve.
func collect(sc *bufio.Scanner) func() []serveStats {
	ch := make(chan []serveStats, 1)
	go func() {
		var out []serveStats
		for sc.Scan() {
			var st serveStats
			if json.Unmarshal(sc.Bytes(), &st) == nil {
				out = append(out, st)
			}
		}
		ch <- out
	}()
	return func() []serveStats { return <-ch }
}

func postCharge(t *testing.T, url, key, op string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/charges", strings.NewReader(`{"amount":100,"currency":"usd","operation":"`+op+`"}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestServe: serve answers as idemtest does on the port it printed, and
// counts on stopping what it executed and replayed.
func TestServe(t *testing.T) {
	url, sc, stop := startServe(t)
	rest := collect(sc)

	first := postCharge(t, url, "k1", "order-1")
	again := postCharge(t, url, "k1", "order-1")
	unkeyed := postCharge(t, url, "", "order-2")
	unkeyedAgain := postCharge(t, url, "", "order-2")
	code := stop()
	lines := rest()

	assert.Equal(t, exitOK, code)
	assert.Equal(t, http.StatusOK, first.StatusCode)
	assert.Equal(t, "true", again.Header.Get("Idempotent-Replayed"))
	assert.Equal(t, http.StatusOK, unkeyed.StatusCode)
	assert.Equal(t, http.StatusOK, unkeyedAgain.StatusCode)
	require.Len(t, lines, 1, "one counts line, on stopping")
	st := lines[0]
	assert.Equal(t, "stopped", st.State)
	assert.Equal(t, 4, st.Requests)
	assert.Equal(t, 3, st.Executions)
	assert.Equal(t, 2, st.Operations)
	assert.Equal(t, 1, st.Duplicates, "the unkeyed retry ran again")
	assert.Equal(t, 1, st.Replays)
	assert.Contains(t, st.Faults, "rate-limited", "every fault kind is listed")
}

// TestServeFaults: the fault flags reach the server: a rate limit of one
// request (and a bucket of one) answers the second request 429, and a
// drop-request rate of 1 drops every request.
func TestServeFaults(t *testing.T) {
	t.Run("rate limit", func(t *testing.T) {
		url, sc, stop := startServe(t, "-rate-limit", "0.001", "-rate-burst", "1", "-retry-after", "7s")
		rest := collect(sc)
		ok := postCharge(t, url, "k1", "a")
		limited := postCharge(t, url, "k2", "b")
		stop()
		lines := rest()

		assert.Equal(t, http.StatusOK, ok.StatusCode)
		assert.Equal(t, http.StatusTooManyRequests, limited.StatusCode)
		assert.Equal(t, "7", limited.Header.Get("Retry-After"))
		require.Len(t, lines, 1)
		assert.Equal(t, 1, lines[0].Faults["rate-limited"])
	})
	t.Run("drop request", func(t *testing.T) {
		url, sc, stop := startServe(t, "-drop-request", "1")
		rest := collect(sc)
		req, err := http.NewRequest(http.MethodPost, url+"/v1/charges", strings.NewReader(`{"amount":1,"currency":"usd","operation":"a"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		stop()
		lines := rest()

		assert.Error(t, err, "the connection closed without a reply")
		require.Len(t, lines, 1)
		assert.Equal(t, 1, lines[0].Faults["drop-request"])
		assert.Zero(t, lines[0].Executions)
	})
}

func TestServeUsage(t *testing.T) {
	tests := []struct {
		give []string
		want string
	}{
		{[]string{"-drop-request", "1.5"}, "-drop-request must be between 0 and 1"},
		{[]string{"-slow", "NaN"}, "-slow must be between 0 and 1"},
		{[]string{"-drop-request", "0.6", "-unavailable", "0.6"}, "add up to more than 1"},
		{[]string{"-rate-limit", "-1"}, "-rate-limit must be"},
		{[]string{"-latency", "-1s"}, "-latency must not be negative"},
		{[]string{"-conflict-burst", "0"}, "-conflict-burst must be at least 1"},
		{[]string{"-addr", "256.0.0.1:0"}, "-addr:"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.give, " "), func(t *testing.T) {
			out := runIn(append([]string{"serve"}, tt.give...)...)
			assert.Equal(t, exitUsage, out.code)
			assert.Contains(t, out.stderr, tt.want)
		})
	}
}
