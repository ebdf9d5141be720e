package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// refusingTransport refuses every request before it leaves: an attempt
// that sent nothing, retried.
type refusingTransport struct{}

func (refusingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
}

// The client's log records redact the URL's secret query parameters and
// its password in their "url" attribute; their "error" attribute, the
// error's text, must not carry them either. A transport's error came back
// as a *url.Error holding the request's URL as it is (net/http's own
// Client strips the password), and the retry record logged its text.
// Checked to fail with operation.redact keeping the URL as it is.
func TestAttack7LogErrorCarriesNoURLSecret(t *testing.T) {
	var out bytes.Buffer
	c := &idemhttp.Client{
		Logger:     slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})),
		HTTPClient: &http.Client{Transport: refusingTransport{}},
		Policy:     &idemhttp.Policy{MaxAttempts: 2, Backoff: func(int) time.Duration { return time.Millisecond }},
	}
	req, err := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), "k-attack7-url"), http.MethodPost,
		"http://user:pa55word-7c1@127.0.0.1:9/v1/charges?api_key=sk_live_attack7", strings.NewReader("{}"))
	require.NoError(t, err)
	_, err = c.Do(req)
	require.Error(t, err)
	log := out.String()
	require.Contains(t, log, "url=", "a retry was logged")
	assert.NotContains(t, log, "pa55word-7c1", "the URL's password in the log: %s", log)
	assert.NotContains(t, log, "sk_live_attack7", "the URL's secret query parameter in the log: %s", log)
}
