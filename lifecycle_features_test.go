package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/contract"
)

// This file pins issue 31: every feature and caller option goes through
// the one lifecycle (judge, outcome, settle), whichever Client, entry
// point or callback is involved.

// gatedDialer blocks every dial until open is closed, then refuses it:
// a call whose attempt is on its way and will turn out not sent.
type gatedDialer struct {
	dialing chan struct{} // closed at the first dial
	open    chan struct{}
	once    atomic.Bool
}

func newGatedDialer() *gatedDialer {
	return &gatedDialer{dialing: make(chan struct{}), open: make(chan struct{})}
}

func (g *gatedDialer) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	if g.once.CompareAndSwap(false, true) {
		close(g.dialing)
	}
	select {
	case <-g.open:
	case <-ctx.Done():
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
}

// Issue 31 §1.1: two Clients sharing one journal share the one-sender
// rule. Client A begins the operation's entry and is dialling; client B
// calls the same operation meanwhile. B must wait for A, not find A's
// entry and send under it while A, whose dial is then refused, withdraws
// it: the rerun would begin a new entry under a new key and charge
// twice. Checked to fail with the slots scoped by Client (config.scope =
// cfg): B sent at once, A withdrew the entry B sent under, and the rerun
// ran the operation a second time.
func TestOneSenderPerJournalAcrossClients(t *testing.T) {
	srv := newScripted(t, reply(201, `{"id":"ch_1"}`))
	j := newRecJournal()
	g := newGatedDialer()
	a := &Client{Journal: j, Policy: &Policy{MaxAttempts: 1}, HTTPClient: &http.Client{Transport: &http.Transport{DialContext: g.dial}}}
	b := &Client{Journal: j, Policy: fast()}
	ctx := WithOperation(context.Background(), "order-1")

	aErr := make(chan error, 1)
	go func() {
		_, err := a.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
		aErr <- err
	}()
	<-g.dialing
	type result struct {
		status int
		err    error
	}
	bRes := make(chan result, 1)
	go func() {
		resp, err := b.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
		if err != nil {
			bRes <- result{err: err}
			return
		}
		resp.Body.Close()
		bRes <- result{status: resp.StatusCode}
	}()
	require.Eventually(t, func() bool { return slots.waiters(j) == 1 || len(srv.Hits()) > 0 }, 5*time.Second, time.Millisecond)
	assert.Empty(t, srv.Hits(), "B waits for A; it has not sent")
	close(g.open)
	assert.ErrorIs(t, <-aErr, ErrNotSent, "A sent nothing, and withdrew its entry")
	r := <-bRes
	require.NoError(t, r.err)
	assert.Equal(t, 201, r.status)

	_, err := (&Client{Journal: j}).Do(post(t, srv.URL, chargeBody).WithContext(ctx))
	assert.ErrorIs(t, err, ErrAlreadyDone, "the rerun sees B's outcome")
	assert.Len(t, srv.Hits(), 1, "the operation ran once")
	assert.Zero(t, slots.held(j), "no slot left held")
}

// valueJournal is a journal whose value cannot be a map key.
type valueJournal struct {
	*recJournal
	tags map[string]string
}

// The slots' scope is the journal: Clients on two journals do not wait
// for each other, even for one operation id, and a journal whose value
// is not comparable gets slots of its Client's own (no panic). Checked to
// fail with the scope a constant: the second call waited for the first,
// which the server held until both had arrived.
func TestSlotsAreScopedByJournal(t *testing.T) {
	var arrived atomic.Int32
	both := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrived.Add(1) == 2 {
			close(both)
		}
		select {
		case <-both:
			w.WriteHeader(201)
		case <-time.After(2 * time.Second):
			w.WriteHeader(504) // the other never came: it was waiting for a slot
		}
	}))
	defer srv.Close()
	ctx := WithOperation(context.Background(), "order-2")
	clients := []*Client{
		{Journal: newRecJournal(), Policy: &Policy{MaxAttempts: 1}},
		{Journal: valueJournal{newRecJournal(), map[string]string{}}, Policy: &Policy{MaxAttempts: 1}},
	}
	status := make(chan int, len(clients))
	for _, c := range clients {
		go func() {
			resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
			if err != nil {
				status <- 0
				return
			}
			resp.Body.Close()
			status <- resp.StatusCode
		}()
	}
	assert.Equal(t, 201, <-status)
	assert.Equal(t, 201, <-status)
}

// markJournal is a journal with a high-water mark (HighWater).
type markJournal struct {
	*recJournal
	mark time.Time
}

func (m markJournal) HighWater(context.Context) (time.Time, error) { return m.mark, nil }

// Issue 31 §1.2: a done entry refetched with RefetchDone is judged by the
// clock rules of a pending one. The clock was set back 2 h: the entry
// looks 23 h old but is 25 h old by the journal's high-water mark, past
// the server's retention, so the rerun gets DoneError and sends nothing.
// Checked to fail with judge's done branch checking only now - Created
// against the retention: the rerun resent the 25-hour-old key.
func TestRefetchDoneIsJudgedByTheClock(t *testing.T) {
	ctx := context.Background()
	srv := newScripted(t, reply(201, `{"id":"ch_9"}`, "Idempotent-Replayed", "true"))
	now := time.Now()
	j := markJournal{newRecJournal(), now.Add(2 * time.Hour)}
	created := now.Add(-23 * time.Hour)
	_, err := j.Begin(ctx, &Entry{Operation: "op-back", Key: "k-back", Method: "POST", URL: srv.URL,
		Fingerprint: contract.Fingerprint("POST", srv.URL, []byte(chargeBody)), State: StatePending, Created: created, Updated: created})
	require.NoError(t, err)
	require.NoError(t, j.Finish(ctx, "k-back", Outcome{State: StateDone, Status: 201, Attempts: 1, At: created}))

	c := &Client{Journal: j, Policy: &Policy{RefetchDone: true}, clock: func() time.Time { return now }}
	_, err = c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-back")))
	var done *DoneError
	require.ErrorAs(t, err, &done)
	assert.Empty(t, srv.Hits(), "nothing resent under a key the server may have forgotten")

	// The same entry with the clock where the mark is: refetched.
	c = &Client{Journal: markJournal{j.recJournal, now}, Policy: &Policy{RefetchDone: true}, clock: func() time.Time { return now }}
	resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(WithOperation(ctx, "op-back")))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Len(t, srv.Hits(), 1, "within the retention, by a clock not behind the mark")
}

// fencingJournal refuses every Delete by fencing, as a fleet's journal
// does when another worker has taken the entry since this one wrote it.
type fencingJournal struct{ *recJournal }

func (f fencingJournal) Delete(_ context.Context, key string) error {
	return fmt.Errorf("delete %s: %w: held by worker-2", key, ErrFenced)
}

// Issue 31 §1.3: a call that sent nothing but whose withdrawal the
// journal refused by fencing does not report ErrNotSent: another sender
// holds the entry and may have sent it, and a caller trying again under
// a new key (as ErrNotSent allows) could run the operation twice. The
// error says what is known: fenced, the entry's state. Checked to fail
// with withdraw counting ErrFenced as "nothing left": the error matched
// ErrNotSent.
func TestFencedWithdrawalIsNotNotSent(t *testing.T) {
	j := fencingJournal{newRecJournal()}
	c := &Client{Journal: j, Policy: &Policy{MaxAttempts: 1}}
	_, err := c.Do(post(t, "http://"+deadAddr(t), chargeBody).WithContext(WithOperation(context.Background(), "op-fenced")))
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotSent)
	assert.ErrorIs(t, err, ErrFenced)
	var g *GiveUpError
	assert.ErrorAs(t, err, &g, "the call's own error stays reachable")
	assert.Contains(t, err.Error(), "now pending")
	assert.Contains(t, err.Error(), "another sender may have sent it")
}

// Issue 31 §1.4: a 3xx left unfollowed, for any reason, leaves the entry
// pending, through Do and through StandardClient: the caller's
// CheckRedirect returning http.ErrUseLastResponse, a redirect without a
// Location, a 300 net/http never follows. Checked to fail with outcome()
// taking a 3xx with a nil error for done (only the client's own refusal
// counted): the entry was done, and a rerun sent nothing.
func TestUnfollowed3xxStaysPendingForAnyReason(t *testing.T) {
	tests := []struct {
		name  string
		step  step
		check func(*http.Request, []*http.Request) error
	}{
		{"caller's ErrUseLastResponse", reply(307, "", "Location", "/elsewhere"), func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		{"no Location", reply(307, ""), nil},
		{"300", reply(300, "", "Location", "/a"), nil},
	}
	for _, tt := range tests {
		for _, sdk := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sdk=%v", tt.name, sdk), func(t *testing.T) {
				srv := newScripted(t, tt.step)
				j := newRecJournal()
				c := &Client{Journal: j, Policy: fast(), HTTPClient: &http.Client{CheckRedirect: tt.check}}
				do := c.Do
				if sdk {
					do = c.StandardClient().Do
				}
				ctx := WithOperation(context.Background(), "op-3xx")
				resp, err := do(post(t, srv.URL, chargeBody).WithContext(ctx))
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, 3, resp.StatusCode/100)
				e, err := j.Lookup(context.Background(), "op-3xx")
				require.NoError(t, err)
				assert.Equal(t, StatePending, e.State, "nothing ran at the target")
			})
		}
	}
}

// Issue 31 §1.9: the same answer settles the journal the same way through
// every entry point. A key mismatch handed to an SDK through
// StandardClient (as its last response) settles the entry done, as Do's
// *KeyMismatchError does, and Resume never resends it; a give-up on 503
// stays pending both ways. Checked to fail with settle deciding on the
// response passed through rather than on the give-up it stands for
// (passedThrough meaning pending): the 422 left the entry pending, and
// Resume resent a request the server had refused for good.
func TestEveryEntryPointSettlesTheSameAnswerAlike(t *testing.T) {
	mismatch := reply(422, `{"type":"https://example.com/idempotency","title":"Idempotency-Key is already used"}`, "Content-Type", "application/problem+json")
	tests := []struct {
		name string
		step step
		want State
	}{
		{"key mismatch", mismatch, StateDone},
		{"503 until exhausted", reply(503, ""), StatePending},
	}
	for _, tt := range tests {
		states := map[bool]State{}
		for _, sdk := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sdk=%v", tt.name, sdk), func(t *testing.T) {
				srv := newScripted(t, tt.step)
				j := newRecJournal()
				c := &Client{Journal: j, Policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}}
				req := post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-answer"))
				req.Header.Set("Idempotency-Key", "caller-key-31") // a key that may have been used: a 422 is the server's word on it
				var resp *http.Response
				var err error
				if sdk {
					resp, err = c.StandardClient().Do(req)
				} else {
					resp, err = c.Do(req)
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				e, err := j.Lookup(context.Background(), "op-answer")
				require.NoError(t, err)
				states[sdk] = e.State
				assert.Equal(t, tt.want, e.State)
				before := len(srv.Hits())
				rs, err := c.Resume(context.Background(), nil)
				require.NoError(t, err)
				if tt.want == StateDone {
					assert.Empty(t, rs, "Resume resends nothing the server refused for good")
					assert.Len(t, srv.Hits(), before)
				}
			})
		}
		assert.Equal(t, states[false], states[true], "%s: Do and StandardClient agree", tt.name)
	}
}

// errPanicHook is what the panicking callbacks below panic with.
var errPanicHook = errors.New("hook panicked")
