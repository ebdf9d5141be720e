package redis_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	idemredis "github.com/idemkit/idemhttp/contrib/redis"
	"github.com/idemkit/idemhttp/idemserver"
)

// tsvLines returns the lines of a testdata file, comments left out, split
// at tabs.
func tsvLines(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "#") {
			out = append(out, strings.Split(sc.Text(), "\t"))
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// TestBaselineRecords: the values the release users run before this one
// (commit 2d053bb) left in Redis (testdata/baseline) are read by this
// release: every key it stored replays as it was answered, with this
// release's fingerprints accepting that release's; the claim in progress
// still holds its key (409); the response too large to store answers 410
// (issue 30, §4). Checked to fail with the fingerprints of earlier
// versions refused (422 instead), and with the value parser made to
// refuse the length's last digit (every key 503).
func TestBaselineRecords(t *testing.T) {
	c := newClient(t, 0)
	prefix := newPrefix(t, c)
	ctx := context.Background()
	for _, l := range tsvLines(t, "testdata/baseline/records.tsv") {
		require.Len(t, l, 2)
		k, err := hex.DecodeString(l[0])
		require.NoError(t, err)
		v, err := hex.DecodeString(l[1])
		require.NoError(t, err)
		require.NoError(t, c.Set(ctx, prefix+string(k), v, time.Hour).Err())
	}
	var runs int
	h := (&idemserver.Middleware{
		Store:         idemredis.NewStore(c, &idemredis.Options{Prefix: prefix}),
		Principal:     func(r *http.Request) string { return r.Header.Get("X-Account") },
		MaxStoredBody: 64,
		Logger:        slog.New(slog.DiscardHandler),
	}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusTeapot)
	}))
	n := 0
	for _, l := range tsvLines(t, "testdata/baseline/requests.tsv") {
		require.Len(t, l, 9)
		name, account, key, do := l[0], l[1], l[2], l[5]
		var ct, body, response string
		for i, dst := range []*string{&ct, &body, &response} {
			var err error
			*dst, err = strconv.Unquote(l[[]int{3, 4, 7}[i]])
			require.NoError(t, err, name)
		}
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/charges?expand=customer", strings.NewReader(body))
			r.Header.Set("Idempotency-Key", key)
			r.Header.Set("X-Account", account)
			r.Header.Set("X-Do", do)
			r.Header.Set("Content-Type", ct)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			switch name {
			case "claim":
				assert.Equal(t, http.StatusConflict, w.Code)
			case "big":
				assert.Equal(t, http.StatusGone, w.Code)
			default:
				assert.Equal(t, l[6], strconv.Itoa(w.Code), w.Body.String())
				assert.Equal(t, response, w.Body.String())
				assert.Equal(t, "true", w.Header().Get(idemserver.ReplayedHeader))
				assert.Equal(t, l[8], w.Header().Get("X-Charge"))
			}
		})
		n++
	}
	assert.Equal(t, 7, n)
	assert.Zero(t, runs, "no key ran again")
}
