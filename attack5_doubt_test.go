package idemhttp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/contract"
)

// doubtJournal is a journal whose clock was once found set back
// (ClockDoubt), and has since passed its mark.
type doubtJournal struct {
	*recJournal
	doubt time.Time
}

func (d doubtJournal) ClockDoubt(context.Context) (time.Time, error) { return d.doubt, nil }

// TestAttack5DoubtOnEveryPath: an entry created before the journal's
// clock doubt is sent on no path once the clock has passed the mark: a
// rerun of its operation (pending), a RefetchDone rerun (done without a
// kept result) and a Resume with the entry given all refuse it
// (ErrClockJump, or DoneError for the done one), send nothing and leave
// it as it was; an operation begun after the doubt is sent. Checked to
// fail with age's doubt check removed: all three reruns resent the entry.
// (No finding: the record that the doubt holds on every path.)
func TestAttack5DoubtOnEveryPath(t *testing.T) {
	ctx := context.Background()
	srv := newScripted(t, reply(201, `{"id":"ch_1"}`))
	now := time.Now()
	j := doubtJournal{newRecJournal(), now.Add(-30 * time.Minute)}
	created := now.Add(-time.Hour) // within any retention by the clock, but before the doubt
	fp := contract.Fingerprint("POST", srv.URL, []byte(chargeBody))
	for _, op := range []string{"op-pending", "op-done"} {
		_, err := j.Begin(ctx, &Entry{Operation: op, Key: "k-" + op, Method: "POST", URL: srv.URL, Body: []byte(chargeBody),
			Fingerprint: fp, State: StatePending, Created: created, Updated: created})
		require.NoError(t, err)
	}
	require.NoError(t, j.Finish(ctx, "k-op-done", Outcome{State: StateDone, Status: 201, Attempts: 1, At: created}))
	c := &Client{Journal: j, Policy: &Policy{RefetchDone: true}, clock: func() time.Time { return now }}

	_, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-pending")))
	assert.ErrorIs(t, err, ErrClockJump, "a rerun of the pending operation")
	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-done")))
	var done *DoneError
	assert.ErrorAs(t, err, &done, "a RefetchDone rerun of the done operation")
	e, err := j.Get(ctx, "k-op-pending")
	require.NoError(t, err)
	res, err := c.Resume(ctx, &ResumeOptions{Entries: []*Entry{e}})
	require.NoError(t, err)
	require.Len(t, res, 1)
	assert.ErrorIs(t, res[0].Err, ErrClockJump, "a Resume with the entry given")
	assert.Empty(t, srv.Hits(), "nothing sent under a key of unknown age")
	e, err = j.Get(ctx, "k-op-pending")
	require.NoError(t, err)
	assert.Equal(t, StatePending, e.State, "left for a person")

	resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-new")))
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Len(t, srv.Hits(), 1, "an operation begun after the doubt is sent")
}
