package redis_test

import (
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

// The fresh-eyes attack on the last fixes of the previous session
// (attack4): core rule 2 (a panic after the answer) over the Redis store.

// TestPanicPointsOverRedis: a handler panicking at each point of its
// response, its key in Redis. Checked to fail with rule 2's case
// removed from servercore.Returned (every "after" point ran twice).
func TestPanicPointsOverRedis(t *testing.T) {
	c := newClient(t, 0)
	runPanicPoints(t, func(t *testing.T) idemserver.Store {
		return idemredis.NewStore(c, &idemredis.Options{Prefix: newPrefix(t, c)})
	})
}

// panicPoints are the points of a handler at which it panics, with what
// a retry of its key must get: a handler that panicked before it
// answered is released (the retry runs it), one that answered a status
// the middleware keeps, or took the connection, ran, and is kept
// completed, not replayable (410), whichever store holds its key (core
// rule 2).
var panicPoints = []struct {
	name   string
	at     func(w http.ResponseWriter)
	want   int // the retry's status
	wantRn int64
}{
	{"before writing", func(http.ResponseWriter) {}, http.StatusCreated, 2},
	{"after the header", func(w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) }, http.StatusGone, 1},
	{"after a flush", func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("ok"))
		_ = http.NewResponseController(w).Flush()
	}, http.StatusGone, 1},
	{"after a body without a header", func(w http.ResponseWriter) { _, _ = w.Write([]byte("ok")) }, http.StatusGone, 1},
	{"after a hijack", func(w http.ResponseWriter) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}, http.StatusGone, 1},
	{"after a 500", func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) }, http.StatusCreated, 2},
}

// runPanicPoints serves each panic point through idemserver.Middleware
// over the store newStore returns, on a real server (a hijack needs a
// connection), and checks what a retry of the key gets.
func runPanicPoints(t *testing.T, newStore func(t *testing.T) idemserver.Store) {
	for _, pp := range panicPoints {
		t.Run(pp.name, func(t *testing.T) {
			var runs atomic.Int64
			h := (&idemserver.Middleware{Store: newStore(t), SingleTenant: true, Logger: slog.New(slog.DiscardHandler)}).Wrap(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						pp.at(w)
						panic("after " + pp.name)
					}
					w.WriteHeader(http.StatusCreated)
				}))
			srv := httptest.NewUnstartedServer(h)
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's stack
			srv.Start()
			defer srv.Close()
			send := func() (int, error) {
				req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
				require.NoError(t, err)
				req.Header.Set("Idempotency-Key", "k-"+strings.ReplaceAll(pp.name, " ", "-"))
				resp, err := srv.Client().Do(req)
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				_, err = io.ReadAll(resp.Body)
				return resp.StatusCode, err
			}
			_, _ = send() // the panicking run: the connection is aborted, or hijacked
			// A hijacking handler closed the connection before it panicked:
			// the retry can arrive while the middleware still finishes the
			// key, and get 409 in progress, as a client would retry.
			got, err := send()
			for deadline := time.Now().Add(5 * time.Second); err == nil && got == http.StatusConflict && time.Now().Before(deadline); {
				<-time.After(10 * time.Millisecond)
				got, err = send()
			}
			require.NoError(t, err)
			assert.Equal(t, pp.want, got)
			assert.Equal(t, pp.wantRn, runs.Load(), "the handler's runs")
		})
	}
}
