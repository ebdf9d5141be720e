package idemhttp_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

// TestLoggerNamesTheKeyByDigest: the client's log records (a retry's)
// name the idempotency key by its digest, never the key itself, unless
// LogKeys. Checked to fail with the retry record's attribute back to
// slog.String("key", ...): the key was in the log.
func TestLoggerNamesTheKeyByDigest(t *testing.T) {
	const key = "caller-key-7f3a9c2e51d4"
	for _, logKeys := range []bool{false, true} {
		t.Run(fmt.Sprint("LogKeys=", logKeys), func(t *testing.T) {
			var n atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			defer srv.Close()
			var out bytes.Buffer
			c := &idemhttp.Client{
				Logger:  slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})),
				LogKeys: logKeys,
				Policy:  &idemhttp.Policy{Backoff: func(int) time.Duration { return time.Millisecond }},
			}
			req, err := http.NewRequestWithContext(idemhttp.WithKey(context.Background(), key), http.MethodPost, srv.URL, strings.NewReader("{}"))
			require.NoError(t, err)
			resp, err := c.Do(req)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, http.StatusCreated, resp.StatusCode)
			log := out.String()
			require.Contains(t, log, "key_digest="+idemhttp.KeyDigest(key), "a retry was logged, naming the key by its digest")
			assert.Equal(t, logKeys, strings.Contains(log, key), "the key itself is in the log only with LogKeys: %s", log)
		})
	}
}

// A log record names an idempotency key by its digest; an operator handed
// a key computes it to find the key's records, the client's and the
// server's.
func ExampleKeyDigest() {
	fmt.Println(idemhttp.KeyDigest("order-42-charge"))
	// Output: 4381a84a2a42
}
