package idemhttp

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatsBudgetAndPending(t *testing.T) {
	srv := newScripted(t, reply(503, ""), reply(200, ""), drop)
	c := &Client{Policy: &Policy{BaseDelay: fast().BaseDelay, MaxDelay: fast().MaxDelay, MaxAttempts: 2, Budget: Budget{Capacity: 100, RetryCost: 7}}}
	assert.Equal(t, Stats{BudgetTokens: 100, BudgetCapacity: 100, JournalPending: 0}, c.Stats())

	resp, err := c.Do(post(t, srv.URL, chargeBody))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, int64(100), c.Stats().BudgetTokens, "the success refunds the retry that succeeded")

	// An operation whose response was lost stays pending in memory.
	req := post(t, srv.URL, chargeBody)
	_, err = c.Do(req.WithContext(WithOperation(WithAttempts(req.Context(), 1), "op-stats")))
	require.Error(t, err)
	assert.Equal(t, 1, c.Stats().JournalPending)

	d := &Client{Policy: unnamed(&Policy{Budget: Budget{Disabled: true}}), Journal: opaqueJournal{newMemJournal(DefaultPolicy().resolve().retention)}}
	assert.Equal(t, Stats{JournalPending: -1}, d.Stats(), "a disabled budget reads 0/0; a journal that cannot count reads -1")
}

// opaqueJournal hides its journal's PendingCount.
type opaqueJournal struct{ Journal }

func TestStatsInFlight(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	srv := newScripted(t, func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(200)
	})
	c := &Client{}
	done := make(chan error, 2)
	for range 2 {
		go func() {
			resp, err := c.Do(post(t, srv.URL, chargeBody))
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
	}
	<-entered
	<-entered
	assert.Equal(t, int64(2), c.Stats().InFlight)
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	assert.Equal(t, int64(0), c.Stats().InFlight)
}
