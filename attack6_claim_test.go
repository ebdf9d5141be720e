package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/contract"
)

// loopClaimJournal is a fleet's journal whose ClaimPending ignores the
// leases it handed out: every call returns the oldest pending entries
// again. failAt, when set, is the call that fails with ErrClockJump.
type loopClaimJournal struct {
	*recJournal
	calls  atomic.Int32
	failAt int32
}

func (l *loopClaimJournal) ClaimPending(ctx context.Context, limit int) ([]*Entry, error) {
	if l.calls.Add(1) == l.failAt {
		return nil, fmt.Errorf("claim: %w", ErrClockJump)
	}
	p, err := l.Pending(ctx)
	slices.SortFunc(p, func(a, b *Entry) int { return strings.Compare(a.Key, b.Key) })
	return p[:min(limit, len(p))], err
}

func seedPendingN(t *testing.T, j Journal, url string, n int) {
	t.Helper()
	now := time.Now()
	for i := range n {
		body := []byte(fmt.Sprintf(`{"n":%d}`, i))
		_, err := j.Begin(context.Background(), &Entry{
			Key: fmt.Sprintf("k-%04d", i), Method: "POST", URL: url, Body: body,
			Fingerprint: contract.Fingerprint("POST", url, body), Created: now, Updated: now, State: StatePending,
		})
		require.NoError(t, err)
	}
}

// Resume's claim loop (claimAll) ends on a journal that hands the same
// full batch out again (it stops when a batch adds nothing), each entry
// is resent once; and a ClaimPending that fails on a later batch
// (ErrClockJump) fails Resume before anything is resent, the error still
// ErrClockJump: fail closed, the claimed entries come back when their
// leases end. Checked to fail with the "added == 0" stop removed (the
// test's deadline: the loop never ends) and with claimAll returning the
// entries claimed so far on an error (resends after a clock jump).
func TestAttack6ClaimAllEndsAndFailsClosed(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	j := &loopClaimJournal{recJournal: newRecJournal()}
	seedPendingN(t, j, srv.URL, claimBatch+44)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rs, err := (&Client{Journal: j, Policy: fast()}).Resume(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, claimBatch, len(rs), "the batch handed out twice is resent once")
	assert.Equal(t, int32(2), j.calls.Load())
	assert.Equal(t, int32(claimBatch), hits.Load())

	hits.Store(0)
	j = &loopClaimJournal{recJournal: newRecJournal(), failAt: 2}
	seedPendingN(t, j, srv.URL, claimBatch+44)
	rs, err = (&Client{Journal: j, Policy: fast()}).Resume(ctx, nil)
	require.ErrorIs(t, err, ErrClockJump)
	assert.Nil(t, rs)
	assert.Zero(t, hits.Load(), "nothing resent")
}
