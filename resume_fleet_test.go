package idemhttp_test

import (
	"context"
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

// TestResumeOnAFleetClaimsWhatItResends: Resume without Entries on a
// journal a fleet shares resends only the entries no live worker holds,
// each under its own lease, and leaves the one another worker holds to
// it: that worker's outcome is not fenced, and the server never sees its
// key from this Resume (the simulator's seed 4158: a resend of a held
// entry let its holder withdraw it while the resend ran it). Checked to
// fail with Resume listing the entries with Pending: the held entry was
// resent, and its holder's Finish was fenced.
func TestResumeOnAFleetClaimsWhatItResends(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	ctx := context.Background()
	fleet := journaltest.NewFleetModel(&journaltest.FleetModelOptions{Lease: time.Hour})
	a, b := fleet.Worker("a"), fleet.Worker("b")
	_, err := a.Begin(ctx, &idemhttp.Entry{Operation: "held", Key: "k-held", Method: http.MethodPost, URL: srv.URL})
	require.NoError(t, err)
	_, err = a.Enqueue(ctx, &idemhttp.Entry{Operation: "free", Key: "k-free", Method: http.MethodPost, URL: srv.URL})
	require.NoError(t, err)

	c := &idemhttp.Client{Journal: b}
	res, err := c.Resume(ctx, nil)
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.Equal(t, "k-free", res[0].Entry.Key)
	assert.NoError(t, res[0].Err)
	assert.Equal(t, []string{"k-free"}, seen)
	assert.NoError(t, a.Finish(ctx, "k-held", idemhttp.Outcome{State: idemhttp.StateDone, Status: http.StatusCreated, Attempts: 1}),
		"the holder's outcome stands")
}
