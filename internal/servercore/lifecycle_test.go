package servercore

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/fingerprint"
)

// moveLog records a config's moves.
type moveLog struct{ moves []string }

func (l *moveLog) config(mode Mode) *Config {
	return &Config{Mode: mode, Observe: func(from, to Phase, ok bool) {
		m := from.String() + ">" + to.String()
		if !ok {
			m = "REFUSED:" + m
		}
		l.moves = append(l.moves, m)
	}}
}

var (
	t0      = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	errDown = errors.New("store down")
	record  = append(EncodeHead(201, http.Header{"X": {"1"}}, 2, nil), "{}"...)
)

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// lockEv is a Streamed run's evidence: a 201 whose claim's lock runs
// until t0+10s, retried every 100 ms.
func lockEv(ev Handler) Handler {
	ev.LockUntil, ev.Retry = at(10*time.Second), 100*time.Millisecond
	return ev
}

var ok201 = Handler{Wrote: true, Status: 201}

// scenario drives one request through the core.
type scenario struct {
	name string
	mode Mode
	run  func(t *testing.T, q *Request)
	want string // the moves, space-separated
}

// claimFree claims a free key.
func claimFree(t *testing.T, q *Request) {
	t.Helper()
	v := q.Claimed(Claim{Found: Found{State: Free}}, nil)
	require.Equal(t, AnswerRun, v.Answer)
}

// stepIs checks a step's action (and phase, when Done).
func stepIs(t *testing.T, got Step, do Action, phase Phase) {
	t.Helper()
	require.Equal(t, do, got.Do, "action")
	if do == Done {
		require.Equal(t, phase, got.Phase, "phase")
	}
}

// The scenarios below drive every move of the table (TestEveryMoveDriven
// checks that), each with the evidence that makes it.
var scenarios = []scenario{
	{name: "store error: 503", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			assert.Equal(t, AnswerStoreFailed, q.Claimed(Claim{Err: errDown}, nil).Answer)
		},
		want: "claiming>answered"},
	{name: "stored", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			assert.Equal(t, Keep, q.Returned(lockEv(ok201)).Do)
			stepIs(t, q.Completed(nil, t0, t0), Done, Stored)
		},
		want: "claiming>running running>completing completing>stored"},
	{name: "complete refused once: pinned, tried again, stored", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(ok201))
			stepIs(t, q.Completed(errDown, t0, t0), Pin, 0)
			s := q.Pinned(nil, t0, t0)
			stepIs(t, s, Wait, 0)
			assert.Equal(t, at(100*time.Millisecond), s.At, "a fast failure waits Retry from its start")
			stepIs(t, q.Completed(nil, s.At, s.At), Done, Stored)
		},
		want: "claiming>running running>completing completing>completing completing>completing completing>stored"},
	{name: "complete refused until the lock's end: pinned", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(ok201))
			stepIs(t, q.Completed(errDown, t0, t0), Pin, 0)
			stepIs(t, q.Pinned(nil, t0, t0), Wait, 0)
			// A slow failure ends at the lock's end: nothing more to try.
			stepIs(t, q.Completed(errDown, at(time.Second), at(10*time.Second)), Done, Pinned)
		},
		want: "claiming>running running>completing completing>completing completing>completing completing>pinned"},
	{name: "complete and pin refused until the lock's end: unsettled", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(ok201))
			stepIs(t, q.Completed(errDown, t0, t0), Pin, 0)
			stepIs(t, q.Pinned(errDown, t0, at(11*time.Second)), Done, Unsettled)
		},
		want: "claiming>running running>completing completing>completing completing>unsettled"},
	{name: "claim lost at complete", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(ok201))
			stepIs(t, q.Completed(ErrClaimLost, t0, t0), Done, Lost)
		},
		want: "claiming>running running>completing completing>lost"},
	{name: "5xx released", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			p := q.Returned(lockEv(Handler{Wrote: true, Status: 500}))
			assert.Equal(t, Plan{Do: Release, Status: 500, Reason: ReasonServerError, Answer: AnswerNone}, p)
			stepIs(t, q.ReleaseDone(nil, t0, t0), Done, Released)
		},
		want: "claiming>running running>releasing releasing>released"},
	{name: "release refused, then through", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(Handler{Panicked: true}))
			s := q.ReleaseDone(errDown, t0, at(time.Second))
			stepIs(t, s, Wait, 0)
			assert.Equal(t, at(time.Second), s.At, "a slow failure is tried again at once")
			stepIs(t, q.ReleaseDone(nil, s.At, s.At), Done, Released)
		},
		want: "claiming>running running>releasing releasing>releasing releasing>released"},
	{name: "release refused until the lock's end: left to the lock", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(Handler{Panicked: true}))
			stepIs(t, q.ReleaseDone(errDown, at(9950*time.Millisecond), at(9960*time.Millisecond)), Done, Unsettled)
		},
		want: "claiming>running running>releasing releasing>unsettled"},
	{name: "claim lost at release", mode: Streamed,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(lockEv(Handler{Panicked: true}))
			stepIs(t, q.ReleaseDone(ErrClaimLost, t0, t0), Done, Lost)
		},
		want: "claiming>running running>releasing releasing>lost"},

	{name: "a run in progress: 409", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			f, err := TxFound(false, false, Row{})
			require.NoError(t, err)
			assert.Equal(t, AnswerInProgress, q.Claimed(Claim{Found: f}, nil).Answer)
		},
		want: "claiming>answered"},
	{name: "committed", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			assert.Equal(t, Plan{Do: Keep, Status: 201, Answer: AnswerSend}, q.Returned(ok201))
			s := q.Committed(CommitOK)
			stepIs(t, s, Done, Stored)
			assert.Equal(t, AnswerSend, s.Answer)
		},
		want: "claiming>running running>completing completing>stored"},
	{name: "commit finds the transaction ended: kept, 410", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(ok201)
			s := q.Committed(CommitEnded)
			stepIs(t, s, KeepUnreplayable, 0)
			assert.Equal(t, 201, s.Status)
			s = q.Marked(nil)
			stepIs(t, s, Done, Stored)
			assert.Equal(t, AnswerTxEnded, s.Answer)
		},
		want: "claiming>running running>completing completing>marking marking>stored"},
	{name: "commit outcome unknown: 503, the key held", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(ok201)
			s := q.Committed(CommitUnknown)
			stepIs(t, s, Done, Unsettled)
			assert.Equal(t, AnswerUnknown, s.Answer)
		},
		want: "claiming>running running>completing completing>unsettled"},
	{name: "commit refused: rolled back, looked at again, released", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(ok201)
			stepIs(t, q.Committed(CommitRefused), Recheck, 0)
			s, _ := q.Rechecked(Claim{Found: Found{State: Free}}, nil)
			stepIs(t, s, Done, Released)
			assert.Equal(t, AnswerRolledBack, s.Answer)
		},
		want: "claiming>running running>completing completing>releasing releasing>released"},
	{name: "serialization failure at commit: again", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			q.cfg.SerializationRetries = 1
			claimFree(t, q)
			q.Returned(ok201)
			stepIs(t, q.Committed(CommitSerialization), Recheck, 0)
			s, _ := q.Rechecked(Claim{Found: Found{State: Free}}, nil)
			stepIs(t, s, Done, Again)
			q.Restart()
			claimFree(t, q)
			q.Returned(ok201)
			stepIs(t, q.Committed(CommitSerialization), Recheck, 0)
			s, _ = q.Rechecked(Claim{Found: Found{State: Free}}, nil)
			stepIs(t, s, Done, Released)
			assert.Equal(t, AnswerSerialization, s.Answer, "no retries left")
		},
		want: "claiming>running running>completing completing>releasing releasing>again again>claiming " +
			"claiming>running running>completing completing>releasing releasing>released"},
	{name: "handler error, and the key was taken meanwhile: answered as a duplicate", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			p := q.Returned(Handler{Err: errDown, Wrote: true, Status: 201})
			assert.Equal(t, AnswerRolledBack, p.Answer)
			stepIs(t, q.RolledBack(false), Recheck, 0)
			s, v := q.Rechecked(Claim{Found: Found{State: Completed, Record: record}}, http.Header{})
			stepIs(t, s, Done, Answered)
			assert.Equal(t, AnswerReplay, v.Answer)
			assert.Equal(t, 201, v.Status)
		},
		want: "claiming>running running>releasing releasing>releasing releasing>answered"},
	{name: "the handler committed itself: marked, and the mark failed", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			p := q.Returned(Handler{Wrote: true, Status: 201, Tx: TxIdle})
			assert.Equal(t, Plan{Do: KeepUnreplayable, Status: 201, Answer: AnswerTxEnded}, p)
			stepIs(t, q.Marked(errDown), Done, Unsettled)
		},
		want: "claiming>running running>marking marking>unsettled"},
	{name: "the rollback finds the transaction ended: marked", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(Handler{Panicked: true})
			s := q.RolledBack(true)
			stepIs(t, s, KeepUnreplayable, 0)
			assert.Equal(t, 0, s.Status, "a panic's status is unknown")
			stepIs(t, q.Marked(nil), Done, Stored)
		},
		want: "claiming>running running>releasing releasing>marking marking>stored"},
	{name: "5xx: rolled back, then sent", mode: Transactional,
		run: func(t *testing.T, q *Request) {
			claimFree(t, q)
			q.Returned(Handler{Wrote: true, Status: 503})
			s := q.RolledBack(false)
			stepIs(t, s, Done, Released)
			assert.Equal(t, AnswerSend, s.Answer)
			assert.Equal(t, Reason(ReasonServerError), s.Reason)
		},
		want: "claiming>running running>releasing releasing>released"},
}

// TestLifecycle drives each scenario and checks the moves it made; no
// move may be refused.
func TestLifecycle(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var l moveLog
			q := l.config(sc.mode).Start()
			before := Refused()
			sc.run(t, &q)
			assert.Equal(t, sc.want, strings.Join(l.moves, " "))
			assert.Equal(t, before, Refused(), "a move was refused")
			assert.True(t, q.Phase().Terminal() || q.Phase() == Again, "ends in %v", q.Phase())
		})
	}
}

// TestEveryMoveDriven: the scenarios make every move the table allows, in
// every mode that allows it: a move no test makes is a move nobody checked.
func TestEveryMoveDriven(t *testing.T) {
	made := map[string]bool{}
	for _, sc := range scenarios {
		var l moveLog
		q := l.config(sc.mode).Start()
		sc.run(t, &q)
		for _, m := range l.moves {
			made[sc.mode.String()+" "+m] = true
		}
	}
	for from := range moves {
		for to := Phase(0); to <= Again; to++ {
			for _, mode := range []Mode{Streamed, Transactional} {
				if moves[from][to]&(1<<mode) == 0 {
					continue
				}
				m := mode.String() + " " + Phase(from).String() + ">" + to.String()
				assert.True(t, made[m], "no scenario makes %s", m)
			}
		}
	}
}

// TestRefusesWhatMustNeverHappen: every move outside the table is
// refused and counted, and the request stays where it was; among them
// the ones that would run an effect twice. (Checked to fail with
// Completing → Released allowed in Streamed mode.)
func TestRefusesWhatMustNeverHappen(t *testing.T) {
	never := []struct {
		mode     Mode
		from, to Phase
		why      string
	}{
		{Streamed, Completing, Releasing, "a Complete that failed frees the key of an effect that ran"},
		{Streamed, Completing, Released, "a Complete that failed frees the key of an effect that ran"},
		{Transactional, Marking, Released, "a handler that committed itself has its key freed"},
		{Streamed, Claiming, Completing, "a record kept without a run"},
		{Transactional, Claiming, Releasing, "a claim given up without a run"},
		{Streamed, Running, Answered, "a run that ends without the store"},
		{Streamed, Stored, Released, "a stored key freed"},
		{Transactional, Answered, Running, "a duplicate runs"},
		{Streamed, Pinned, Released, "a pinned key freed"},
		{Streamed, Releasing, Marking, "a mark in the mode that has none"},
		{Streamed, Again, Claiming, "a run again in the mode that has none"},
	}
	for _, n := range never {
		assert.Zero(t, moves[n.from][n.to]&(1<<n.mode), "%v %v>%v allowed: %s", n.mode, n.from, n.to, n.why)
	}
	// Every move outside the table, tried: refused, counted, no move.
	for from := Phase(0); from <= Again; from++ {
		for to := Phase(0); to <= Again; to++ {
			for _, mode := range []Mode{Streamed, Transactional} {
				if int(from) < len(moves) && moves[from][to]&(1<<mode) != 0 {
					continue
				}
				var l moveLog
				q := l.config(mode).Start()
				q.phase = from
				before := Refused()
				assert.False(t, q.advance(to), "%v %v>%v", mode, from, to)
				assert.Equal(t, from, q.phase)
				assert.Equal(t, before+1, Refused())
				assert.Equal(t, []string{"REFUSED:" + from.String() + ">" + to.String()}, l.moves)
			}
		}
	}
	refused.Store(0) // the refusals above were this test's own
}

// TestReturnedRules: the decision on a run's end, rule by rule, in both
// modes (see Returned). Checked to fail with each of the ten rules
// dropped in turn (its case made false), and with the Unjudged cases
// dropped.
func TestReturnedRules(t *testing.T) {
	tests := []struct {
		name     string
		give     Handler
		streamed Plan
		tx       Plan
	}{
		{"ended transaction: kept, 410", Handler{Wrote: true, Status: 201, Tx: TxIdle},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: KeepUnreplayable, Status: 201, Answer: AnswerTxEnded}},
		{"panic", Handler{Panicked: true, Status: 201},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerNone},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerRolledBack}},
		{"panic after the answer", Handler{Panicked: true, Wrote: true, Status: 201},
			Plan{Do: KeepUnreplayable, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerRolledBack}},
		{"panic after a hijack", Handler{Panicked: true, Wrote: true, Status: 101, Hijacked: true},
			Plan{Do: KeepUnreplayable, Status: 101, Answer: AnswerNone},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerRolledBack}},
		{"panic after a 5xx", Handler{Panicked: true, Wrote: true, Status: 503},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerNone},
			Plan{Do: Release, Reason: ReasonPanic, Answer: AnswerRolledBack}},
		{"gave up: the client left and nothing was written", Handler{ClientGone: true, Status: 200},
			Plan{Do: Release, Reason: ReasonCanceled, Answer: AnswerNone},
			Plan{Do: Release, Reason: ReasonCanceled, Answer: AnswerRolledBack}},
		{"the client left after the answer", Handler{ClientGone: true, Wrote: true, Status: 201},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: Keep, Status: 201, Answer: AnswerSend}},
		{"handler error", Handler{Err: errDown, Wrote: true, Status: 201},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Status: 201, Reason: ReasonRolledBack, Answer: AnswerRolledBack, recheck: true}},
		{"invalid status", Handler{Wrote: true, Status: 1000},
			Plan{Do: Release, Status: 1000, Reason: ReasonNotStorable, Answer: AnswerNone},
			Plan{Do: Release, Status: 1000, Reason: ReasonNotStorable, Answer: AnswerRolledBack}},
		{"hijacked", Handler{Wrote: true, Status: 101, Hijacked: true},
			Plan{Do: KeepUnreplayable, Status: 101, Answer: AnswerNone},
			Plan{Do: Release, Status: 101, Reason: ReasonNotStorable, Answer: AnswerRolledBack}},
		{"too large", Handler{Wrote: true, Status: 201, Overflow: true},
			Plan{Do: KeepUnreplayable, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Status: 201, Reason: ReasonNotStorable, Answer: AnswerTooLarge}},
		{"too large and a 5xx", Handler{Wrote: true, Status: 500, Overflow: true},
			Plan{Do: Release, Status: 500, Reason: ReasonServerError, Answer: AnswerNone},
			Plan{Do: Release, Status: 500, Reason: ReasonNotStorable, Answer: AnswerTooLarge}},
		{"not stored: 409", Handler{Wrote: true, Status: 409},
			Plan{Do: Release, Status: 409, Reason: ReasonNotStored, Answer: AnswerNone},
			Plan{Do: Release, Status: 409, Reason: ReasonNotStored, Answer: AnswerSend}},
		{"ShouldStore panicked", Handler{Wrote: true, Status: 201, Unjudged: true},
			Plan{Do: KeepUnreplayable, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Status: 201, Reason: ReasonPanic, Answer: AnswerRolledBack}},
		{"aborted transaction", Handler{Wrote: true, Status: 201, Tx: TxAborted},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Status: 201, Reason: ReasonRolledBack, Answer: AnswerRolledBack, recheck: true}},
		{"aborted transaction, a 5xx: sent", Handler{Wrote: true, Status: 500, Tx: TxAborted},
			Plan{Do: Release, Status: 500, Reason: ReasonServerError, Answer: AnswerNone},
			Plan{Do: Release, Status: 500, Reason: ReasonServerError, Answer: AnswerSend}},
		{"broken connection", Handler{Wrote: true, Status: 201, Tx: TxBroken},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: Release, Status: 201, Reason: ReasonRolledBack, Answer: AnswerRolledBack, recheck: true}},
		{"kept", Handler{Wrote: true, Status: 201},
			Plan{Do: Keep, Status: 201, Answer: AnswerNone},
			Plan{Do: Keep, Status: 201, Answer: AnswerSend}},
		{"nothing written, the client still there: an empty 200", Handler{Status: 200},
			Plan{Do: Keep, Status: 200, Answer: AnswerNone},
			Plan{Do: Keep, Status: 200, Answer: AnswerSend}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range []struct {
				mode Mode
				want Plan
			}{{Streamed, tt.streamed}, {Transactional, tt.tx}} {
				q := (&Config{Mode: c.mode}).Start()
				q.phase = Running
				got := q.Returned(tt.give)
				assert.Equal(t, c.want, got, "%v", c.mode)
			}
		})
	}
}

// TestClaimVerdicts: the claim's evidence and the answer it gets.
func TestClaimVerdicts(t *testing.T) {
	body := []byte(`{"amount":1}`)
	r := httptest.NewRequest("POST", "/charges", strings.NewReader(string(body)))
	r.Header.Set("Content-Type", "application/json")
	fp := fingerprint.Current(r, body)
	tests := []struct {
		name      string
		give      Claim
		defaultFP bool
		want      Answer
	}{
		{"store full", Claim{Err: ErrStoreFull}, true, AnswerStoreFull},
		{"store error", Claim{Err: errDown}, true, AnswerStoreFailed},
		{"invalid state", Claim{Found: Found{State: 9}}, true, AnswerStoreFailed},
		{"free", Claim{Found: Found{State: Free}}, true, AnswerRun},
		{"held, same request", Claim{Found: Found{State: Held, Fingerprint: fp}}, true, AnswerInProgress},
		{"held, another request", Claim{Found: Found{State: Held, Fingerprint: "other"}}, true, AnswerMismatch},
		{"held by a run whose fingerprint is unknown", Claim{Found: Found{State: Held, NoFingerprint: true}}, true, AnswerInProgress},
		{"completed", Claim{Found: Found{State: Completed, Fingerprint: fp, Record: record}}, true, AnswerReplay},
		{"completed, another request", Claim{Found: Found{State: Completed, Fingerprint: "other", Record: record}}, true, AnswerMismatch},
		{"completed by the previous release", Claim{Found: Found{State: Completed, Fingerprint: fingerprint.V1(r, body), Record: record}}, true, AnswerReplay},
		{"completed by a release before canonical forms", Claim{Found: Found{State: Completed, Fingerprint: fingerprint.V0(r, body), Record: record}}, true, AnswerReplay},
		{"an older version with a fingerprint of the caller's own", Claim{Found: Found{State: Completed, Fingerprint: fingerprint.V1(r, body), Record: record}}, false, AnswerMismatch},
		{"not replayable", Claim{Found: Found{State: Completed, Fingerprint: fp, Record: Unreplayable(201)}}, true, AnswerNotReplayable},
		{"corrupt", Claim{Found: Found{State: Completed, Fingerprint: fp, Record: []byte{9}}}, true, AnswerCorrupt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.give.Fingerprint, tt.give.Request, tt.give.Body = fp, r, body
			q := (&Config{Mode: Streamed, DefaultFingerprint: tt.defaultFP}).Start()
			hdr := http.Header{}
			v := q.Claimed(tt.give, hdr)
			assert.Equal(t, tt.want, v.Answer)
			if tt.want == AnswerReplay {
				assert.Equal(t, 201, v.Status)
				assert.Equal(t, "{}", string(v.Body))
				assert.Equal(t, "1", hdr.Get("X"))
			} else {
				assert.Empty(t, hdr)
			}
		})
	}
}

// TestTxFound: a transactional claim's lock and row, and what they mean.
// A completed row wins over a busy lock (issue 30, §2.5). (Checked to
// fail with the lock checked before the row: many retries of a completed
// key got 409.)
func TestTxFound(t *testing.T) {
	done := Row{Exists: true, Completed: true, Fingerprint: "fp", Record: record}
	held := Row{Exists: true, Fingerprint: "fp"}
	tests := []struct {
		name            string
		locked, claimed bool
		row             Row
		want            Found
		err             bool
	}{
		{"claimed", true, true, Row{}, Found{State: Free}, false},
		{"completed, lock free", true, false, done, Found{State: Completed, Fingerprint: "fp", Record: record}, false},
		{"completed, lock busy: the replay, not 409", false, false, done, Found{State: Completed, Fingerprint: "fp", Record: record}, false},
		{"a claim row (a Store's, or a handler that committed itself)", false, false, held, Found{State: Held, Fingerprint: "fp"}, false},
		{"a claim row, lock free", true, false, held, Found{State: Held, Fingerprint: "fp"}, false},
		{"lock busy, no row: a run in progress", false, false, Row{}, Found{State: Held, NoFingerprint: true}, false},
		{"lock free, no row, nothing written: unknown", true, false, Row{}, Found{}, true},
		{"written without the lock: impossible", false, true, Row{}, Found{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TxFound(tt.locked, tt.claimed, tt.row)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.err, err != nil, "%v", err)
		})
	}
	assert.Equal(t, Found{State: Free}, RowFound(Row{}))
	assert.Equal(t, Found{State: Held, Fingerprint: "fp"}, RowFound(held))
	assert.Equal(t, Found{State: Completed, Fingerprint: "fp", Record: record}, RowFound(done))
	// The row's token goes with it, for Rechecked to tell the request's own.
	assert.Equal(t, Found{State: Held, Fingerprint: "fp", Token: "t"}, RowFound(Row{Exists: true, Fingerprint: "fp", Token: "t"}))
	f, err := TxFound(false, false, Row{Exists: true, Fingerprint: "fp", Token: "t"})
	require.NoError(t, err)
	assert.Equal(t, Found{State: Held, Fingerprint: "fp", Token: "t"}, f)
}

// TestRecheckOwnRow: a look at the key after a rollback that finds the
// request's own claim row in progress (its token) finds what the
// handler's own COMMIT committed: the key is kept, not replayable, and the
// answer is the ended transaction's 500, whatever the rollback's cause;
// another request's row, or a row whose token is not known, is a
// duplicate's: 409 as before (the simulator's bugOwnRow409, seed 9714).
// Checked to fail with the own-token case removed from Rechecked: the
// first case answered 409 (Answered) instead of marking.
func TestRecheckOwnRow(t *testing.T) {
	const mine = "tx-1"
	ownRow := Found{State: Held, Fingerprint: "fp", Token: mine}
	tests := []struct {
		name   string
		end    func(q *Request) Step // the run's end, up to the Recheck
		found  Found
		token  string // the request's claim token
		want   Action
		answer Answer // the client's
		status int    // the marker's
		moves  string
	}{
		{"commit refused, its own row: marked, 500", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitRefused) },
			ownRow, mine, KeepUnreplayable, AnswerTxEnded, 201,
			"claiming>running running>completing completing>releasing releasing>marking marking>stored"},
		{"serialization failure at commit, its own row: marked, never again", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitSerialization) },
			ownRow, mine, KeepUnreplayable, AnswerTxEnded, 201,
			"claiming>running running>completing completing>releasing releasing>marking marking>stored"},
		{"claim lost at commit, its own row: marked", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitClaimLost) },
			ownRow, mine, KeepUnreplayable, AnswerTxEnded, 201,
			"claiming>running running>completing completing>releasing releasing>marking marking>stored"},
		{"handler error in an aborted transaction, its own row: marked", func(q *Request) Step {
			q.Returned(Handler{Err: errDown, Wrote: true, Status: 201, Tx: TxAborted})
			return q.RolledBack(false)
		}, ownRow, mine, KeepUnreplayable, AnswerTxEnded, 201,
			"claiming>running running>releasing releasing>releasing releasing>marking marking>stored"},
		{"commit refused, another request's row: 409", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitRefused) },
			ownRow, "tx-2", Done, AnswerInProgress, 201,
			"claiming>running running>completing completing>releasing releasing>answered"},
		{"commit refused, a row whose token is unknown: 409", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitRefused) },
			Found{State: Held, Fingerprint: "fp"}, "", Done, AnswerInProgress, 201,
			"claiming>running running>completing completing>releasing releasing>answered"},
		{"commit refused, its own token on a completed row: the replay", func(q *Request) Step { q.Returned(ok201); return q.Committed(CommitRefused) },
			Found{State: Completed, Fingerprint: "fp", Record: record, Token: mine}, mine, Done, AnswerReplay, 201,
			"claiming>running running>completing completing>releasing releasing>answered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l moveLog
			cfg := l.config(Transactional)
			q := cfg.Start()
			claimFree(t, &q)
			stepIs(t, tt.end(&q), Recheck, 0)
			s, v := q.Rechecked(Claim{Found: tt.found, Fingerprint: "fp", Token: tt.token}, http.Header{})
			require.Equal(t, tt.want, s.Do)
			if s.Do == KeepUnreplayable {
				assert.Equal(t, tt.status, s.Status, "the marker's status")
				s = q.Marked(nil)
				stepIs(t, s, Done, Stored)
				assert.Equal(t, tt.answer, s.Answer)
			} else {
				assert.Equal(t, tt.answer, v.Answer)
			}
			assert.Equal(t, tt.moves, strings.Join(l.moves, " "))
		})
	}
}

// TestCompleteNeverFreesTheKey: whatever a Streamed Complete answers, in
// whatever order, the request never ends Released: the handler ran.
// (Checked to fail with Completed ending in Released after a failure.)
func TestCompleteNeverFreesTheKey(t *testing.T) {
	answers := []error{nil, errDown, ErrClaimLost}
	var walk func(q Request, depth int)
	walk = func(q Request, depth int) {
		for _, err := range answers {
			q := q
			now := at(time.Duration(depth) * time.Second)
			s := q.Completed(err, now, now)
			if s.Do == Pin {
				for _, perr := range answers {
					q := q
					s := q.Pinned(perr, now, now)
					if s.Do == Done {
						assert.NotEqual(t, Released, s.Phase)
					} else if depth < 12 {
						walk(q, depth+1)
					}
				}
				continue
			}
			if s.Do == Done {
				assert.NotEqual(t, Released, s.Phase)
				continue
			}
			if depth < 12 {
				walk(q, depth+1)
			}
		}
	}
	q := (&Config{Mode: Streamed}).Start()
	q.phase = Running
	q.Returned(lockEv(ok201))
	before := Refused()
	walk(q, 0)
	assert.Equal(t, before, Refused())
}

func (m Mode) String() string {
	if m == Streamed {
		return "streamed"
	}
	return "transactional"
}
