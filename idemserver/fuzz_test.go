package idemserver_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/contract"
)

// FuzzMiddleware sends arbitrary methods, key header values and bodies
// (as raw, JSON or form content) twice through the middleware: it never panics, answers only with the
// statuses the contract allows, and a request it ran with a valid key is
// replayed byte for byte.
func FuzzMiddleware(f *testing.F) {
	f.Add("POST", "k1", []byte(`{"amount":1}`))
	f.Add("POST", `"k1"`, []byte(""))
	f.Add("PATCH", `"unterminated`, []byte("x"))
	f.Add("GET", "k1", []byte(""))
	f.Add("POST", "", []byte("no key"))
	f.Add("POST", "k1", bytes.Repeat([]byte("b"), 300))
	f.Fuzz(func(t *testing.T, method, key string, body []byte) {
		h := (&idemserver.Middleware{SingleTenant: true, MaxBodyBytes: 256}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
		}))
		send := func() *httptest.ResponseRecorder {
			r := &http.Request{
				Method:        method,
				URL:           &url.URL{Path: "/x"},
				Header:        http.Header{},
				Body:          io.NopCloser(bytes.NewReader(body)),
				ContentLength: int64(len(body)),
			}
			if key != "" {
				r.Header.Set("Idempotency-Key", key)
			}
			// Every fingerprint path: raw, canonical JSON, sorted form.
			if ct := [...]string{"", "application/json", "application/x-www-form-urlencoded"}[len(body)%3]; ct != "" {
				r.Header.Set("Content-Type", ct)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		first, second := send(), send()

		require.Contains(t, []int{201, 400, 413}, first.Code)
		keyed := key != "" && (method == "POST" || method == "PATCH")
		_, keyErr := contract.ParseKeyHeader(key)
		if keyed && keyErr == nil && first.Code == http.StatusCreated {
			require.Equal(t, "true", second.Header().Get(idemserver.ReplayedHeader))
			require.Equal(t, first.Body.Bytes(), second.Body.Bytes())
		}
		if !keyed {
			require.Equal(t, http.StatusCreated, first.Code, "unkeyed requests pass through")
			require.Empty(t, second.Header().Get(idemserver.ReplayedHeader))
		}
	})
}
