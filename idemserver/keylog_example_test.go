package idemserver_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/idemkit/idemhttp/idemserver"
)

// The middleware's log names a key by its digest, never by the key
// itself (unless Hooks.RecordKey); an operator handed the key computes
// the digest to find its lines. Here a request the Principal cannot name
// is refused, and logged.
func ExampleKeyDigest() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a stable output
			}
			return a
		},
	}))
	mw := &idemserver.Middleware{
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
		Logger:    logger,
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	req := httptest.NewRequest(http.MethodPost, "/charges", nil) // no X-Account
	req.Header.Set("Idempotency-Key", "9b2f4c1e-5d7a-4e08-8f61-2c3d4b5a6e7f")
	h.ServeHTTP(httptest.NewRecorder(), req)

	fmt.Println(idemserver.KeyDigest("9b2f4c1e-5d7a-4e08-8f61-2c3d4b5a6e7f"))
	// Output:
	// level=ERROR msg="idemserver: Principal returned an empty scope; answered 500 and ran nothing" key_digest=15bb034651a3
	// 15bb034651a3
}
