package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/journaltest"
)

// Two workers' Resumes without Entries, at once, on one fleet journal of
// more entries than one claim batch: each entry is resent by one of them
// only (each under its own claim), and every entry is resolved. A
// regression test: it passed as written (claimAll's paging and the
// model's claims hold).
func TestAttack7TwoResumesOnAFleet(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	ctx := context.Background()
	fleet := journaltest.NewFleetModel(&journaltest.FleetModelOptions{Lease: time.Hour})
	a, b := fleet.Worker("a"), fleet.Worker("b")
	const n = 300 // more than a claim batch (256)
	for i := range n {
		_, err := a.Enqueue(ctx, &idemhttp.Entry{Operation: fmt.Sprint("op-", i), Key: fmt.Sprint("k-", i), Method: http.MethodPost, URL: srv.URL})
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	res := make([][]idemhttp.ResumeResult, 2)
	for i, w := range []idemhttp.Journal{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := (&idemhttp.Client{Journal: w}).Resume(ctx, nil)
			assert.NoError(t, err)
			res[i] = r
		}()
	}
	wg.Wait()
	assert.Equal(t, n, len(res[0])+len(res[1]), "every entry resent by one Resume")
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, seen, n)
	for k, c := range seen {
		assert.Equal(t, 1, c, "key %s sent %d times", k, c)
	}
	for _, e := range fleet.Entries() {
		assert.Equal(t, idemhttp.StateDone, e.State, e.Key)
	}
}
