package inbox

import (
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain fails the run when any test made a move the core's table
// refuses: each is a bug in a shell (the tests that make one on purpose
// clear coreBug).
func TestMain(m *testing.M) {
	var bad []Move
	coreBug = func(from, to State) { bad = append(bad, Move{from, to}) }
	code := m.Run()
	if len(bad) > 0 && code == 0 {
		fmt.Fprintf(os.Stderr, "the message core refused moves: %v\n", bad)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// answer is a ledger's scripted answer to one write.
type answer struct {
	rec Record
	err error
}

// play drives one delivery through the core: the arrival a, the ledger's
// answers in order, then (when the core says run) limit passing first if
// limit is set, and the ending e; after VerbDeadLetter, the shell's dead
// letter ending with dlErr. It returns the decision the shell acts on,
// the one that settles a dead letter (after), the writes the core asked
// for, and the states it went through.
func play(t *testing.T, p Policy, a Arrival, answers []answer, limit bool, e Ending, dlErr error) (dec, after Decision, _ []Op, _ []State) {
	t.Helper()
	d := NewDelivery(p)
	states := []State{d.State()}
	var writes []Op
	step := func(dec Decision) Decision {
		states = append(states, d.State())
		for dec.Write != OpNone {
			writes = append(writes, dec.Write)
			require.NotEmpty(t, answers, "no answer left for %s", dec.Write)
			ans := answers[0]
			answers = answers[1:]
			dec = d.Recorded(ans.rec, ans.err)
			states = append(states, d.State())
		}
		return dec
	}
	dec = step(d.Arrive(a))
	if dec.Verb == VerbRun {
		if limit {
			rel := step(d.LimitPassed())
			require.Equal(t, VerbRelease, rel.Verb)
			require.Equal(t, Decision{}, d.Returned(e), "a released delivery is spent")
			dec = rel
		} else {
			dec = step(d.Returned(e))
		}
	}
	if dec.Verb == VerbDeadLetter {
		require.False(t, d.State().Final(), "a dead letter is settled only once the shell says how it went")
		after = step(d.DeadLettered(dlErr))
	}
	require.True(t, d.State().Final(), "ends in a final state, not %s", d.State())
	require.Empty(t, answers, "every answer used")
	require.Empty(t, d.Refused())
	return dec, after, writes, compact(states)
}

func compact(s []State) []State {
	out := s[:1]
	for _, x := range s[1:] {
		if x != out[len(out)-1] {
			out = append(out, x)
		}
	}
	return out
}

var (
	errBoom   = errors.New("boom")
	errDBDown = errors.New("database down")
)

// TestCoreTransitions drives every transition of the core's table with
// its evidence, and checks what each decides. The table's moves are all
// visited (the last check), so a move added without a case here fails.
//
// Checked to fail with: Recorded in StateChecking running a processed
// message (no ack); Returned counting a shutdown's error (OpFail written,
// StateFailing); Exhausted compared to Failures alone (the crash cases
// run again); LimitPassed releasing before the count (VerbRelease with no
// write); Recorded in StateFailing ignoring Record.Processed (the
// processed message requeued, or dead-lettered on its last run); the
// dead letter deciding OpForget before the shell's dead letter (the
// failing dead letters forget the count: issue 30).
func TestCoreTransitions(t *testing.T) {
	retry := Retry{Delay: time.Second, MaxDelay: time.Minute, MaxDeliveries: 3}
	p := Policy{Retry: retry}
	tests := []struct {
		name    string
		policy  Policy
		arrival Arrival
		answers []answer
		limit   bool
		ending  Ending
		dlErr   error
		want    Decision
		after   Decision
		writes  []Op
		states  []State
	}{
		{
			name:    "first delivery succeeds: no write at all",
			arrival: Arrival{HasID: true},
			want:    Decision{Verb: VerbAck},
			states:  []State{StateReceived, StateRunning, StateAcked},
		},
		{
			name:    "redelivery succeeds: marker, then forgotten",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{}}, {}},
			want:    Decision{Verb: VerbAck},
			writes:  []Op{OpBegin, OpForget},
			states:  []State{StateReceived, StateChecking, StateRunning, StateClosing, StateAcked},
		},
		{
			name:    "redelivery of a processed message: acked unrun, nothing written",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Processed: true, Failures: 2, Running: 5}}},
			want:    Decision{Verb: VerbAck},
			writes:  []Op{OpBegin},
			states:  []State{StateReceived, StateChecking, StateAcked},
		},
		{
			name:    "arrives after its runs killed the process three times: dead-lettered unrun",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Running: 3}}, {rec: Record{Running: 3, DeadLettered: true}}, {}},
			want:    Decision{Verb: VerbDeadLetter, Err: fmt.Errorf("%w: 3 failed runs", ErrExhausted), Failures: 3, Report: true},
			writes:  []Op{OpBegin, OpTombstone, OpForget},
			states:  []State{StateReceived, StateChecking, StateTombstoning, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			name:    "arrives after two failures and a crash: exhausted too",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2, Running: 1}}, {rec: Record{Failures: 2, Running: 1, DeadLettered: true}}, {}},
			want:    Decision{Verb: VerbDeadLetter, Err: fmt.Errorf("%w: 3 failed runs", ErrExhausted), Failures: 3, Report: true},
			writes:  []Op{OpBegin, OpTombstone, OpForget},
			states:  []State{StateReceived, StateChecking, StateTombstoning, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			name:    "the ledger cannot be read: back after a delay, uncounted, unrun",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{err: errDBDown}},
			want:    Decision{Verb: VerbRequeue, Delay: time.Second},
			writes:  []Op{OpBegin},
			states:  []State{StateReceived, StateChecking, StateDeferred},
		},
		{
			name:    "first failure: counted, back after the first delay",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Failures: 1}}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbRequeue, Delay: time.Second, Err: errBoom, Failures: 1},
			writes:  []Op{OpFail},
			states:  []State{StateReceived, StateRunning, StateFailing, StateRetrying},
		},
		{
			name:    "second failure of a redelivery: the delay grows",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 1}}, {rec: Record{Failures: 2}}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbRequeue, Delay: 2 * time.Second, Err: errBoom, Failures: 2},
			writes:  []Op{OpBegin, OpFailBegun},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateRetrying},
		},
		{
			name:    "the last allowed failure: dead-lettered, forgotten",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2}}, {rec: Record{Failures: 3}}, {rec: Record{Failures: 3, DeadLettered: true}}, {}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbDeadLetter, Err: errBoom, Failures: 3, Report: true},
			writes:  []Op{OpBegin, OpFailBegun, OpTombstone, OpForget},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateTombstoning, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			name:    "the last allowed failure, and the dead letter fails: the record kept, back after its delay",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2}}, {rec: Record{Failures: 3}}, {rec: Record{Failures: 3, DeadLettered: true}}},
			ending:  Ending{Err: errBoom},
			dlErr:   errDBDown,
			want:    Decision{Verb: VerbDeadLetter, Err: errBoom, Failures: 3, Report: true},
			after:   Decision{Verb: VerbRequeue, Delay: retry.After(3), Err: fmt.Errorf("inbox: dead letter: %w", errDBDown), Failures: 3},
			writes:  []Op{OpBegin, OpFailBegun, OpTombstone},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateTombstoning, StateDeadLettering, StateDeadLetterFailed},
		},
		{
			name:    "the forget after the dead letter fails: dead-lettered all the same",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Failures: 3}}, {rec: Record{Failures: 3, DeadLettered: true}}, {err: errDBDown}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbDeadLetter, Err: errBoom, Failures: 3, Report: true},
			writes:  []Op{OpFail, OpTombstone, OpForget},
			states:  []State{StateReceived, StateRunning, StateFailing, StateTombstoning, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			// Checked to fail with StateTombstoning dead-lettering
			// whatever the answer (the effect and a dead letter).
			name:    "the tombstone finds the effect committed (a run live elsewhere won): acked, never dead-lettered",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2}}, {rec: Record{Failures: 3}}, {rec: Record{Processed: true}}, {}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbAck},
			writes:  []Op{OpBegin, OpFailBegun, OpTombstone, OpForget},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateTombstoning, StateClosing, StateAcked},
		},
		{
			name:    "the tombstone cannot be written: back after its delay, nothing more counted",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Failures: 3}}, {err: errDBDown}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbRequeue, Delay: retry.After(3), Err: errBoom, Failures: 3},
			writes:  []Op{OpFail, OpTombstone},
			states:  []State{StateReceived, StateRunning, StateFailing, StateTombstoning, StateDeferred},
		},
		{
			// Checked to fail with Recorded in StateChecking ignoring
			// Record.DeadLettered (the message ran after its dead letter).
			name:    "arrives dead-lettered before (its tombstone in the inbox): dead-lettered again, unrun",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{DeadLettered: true}}, {}},
			want:    Decision{Verb: VerbDeadLetter, Err: ErrDeadLettered, Report: true},
			writes:  []Op{OpBegin, OpForget},
			states:  []State{StateReceived, StateChecking, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			// Checked to fail with Recorded in StateFailing ignoring
			// Record.DeadLettered (requeued: it came back for ever).
			name:    "its effect met another delivery's tombstone: dead-lettered again, uncounted",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{DeadLettered: true}}, {}},
			ending:  Ending{Err: ErrDeadLettered},
			want:    Decision{Verb: VerbDeadLetter, Err: ErrDeadLettered, Report: true},
			writes:  []Op{OpFail, OpForget},
			states:  []State{StateReceived, StateRunning, StateFailing, StateDeadLettering, StateClosing, StateDeadLettered},
		},
		{
			name:    "a failure of a processed message (its commit applied, the answer lost): acked, forgotten",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Processed: true}}, {}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbAck},
			writes:  []Op{OpFail, OpForget},
			states:  []State{StateReceived, StateRunning, StateFailing, StateClosing, StateAcked},
		},
		{
			name:    "the last allowed run of a redelivery fails after its effect committed: acked, never dead-lettered",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2}}, {rec: Record{Processed: true}}, {}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbAck},
			writes:  []Op{OpBegin, OpFailBegun, OpForget},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateClosing, StateAcked},
		},
		{
			name:    "a failure the ledger cannot count: back after a delay, uncounted",
			arrival: Arrival{HasID: true},
			answers: []answer{{err: errDBDown}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbRequeue, Delay: time.Second, Err: errBoom},
			writes:  []Op{OpFail},
			states:  []State{StateReceived, StateRunning, StateFailing, StateDeferred},
		},
		{
			name:    "shutdown while the handler runs: back at once, never counted",
			arrival: Arrival{HasID: true},
			ending:  Ending{Err: errBoom, Stopping: true},
			want:    Decision{Verb: VerbRequeue},
			states:  []State{StateReceived, StateRunning, StateHandedBack},
		},
		{
			name:    "shutdown of a begun run: its marker excused",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 2}}, {rec: Record{Failures: 2}}},
			ending:  Ending{Err: errBoom, Stopping: true},
			want:    Decision{Verb: VerbRequeue},
			writes:  []Op{OpBegin, OpExcuse},
			states:  []State{StateReceived, StateChecking, StateRunning, StateClosing, StateHandedBack},
		},
		{
			name:    "a handler that commits as the shutdown comes: acked",
			arrival: Arrival{HasID: true},
			ending:  Ending{Stopping: true},
			want:    Decision{Verb: VerbAck},
			states:  []State{StateReceived, StateRunning, StateAcked},
		},
		{
			name:    "taken ahead and never run at shutdown: back at once, no write",
			arrival: Arrival{HasID: true, Stopping: true, MaybeRedelivered: true},
			want:    Decision{Verb: VerbRequeue},
			states:  []State{StateReceived, StateHandedBack},
		},
		{
			name:    "past the processing limit: counted, then released",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Failures: 1}}},
			limit:   true,
			want:    Decision{Verb: VerbRelease, Failures: 1, Err: errLimit},
			writes:  []Op{OpFail},
			states:  []State{StateReceived, StateRunning, StateReleasing, StateReleased},
		},
		{
			name:    "past the limit, the message processed: released uncounted (its redelivery is a duplicate)",
			arrival: Arrival{HasID: true},
			answers: []answer{{rec: Record{Processed: true}}},
			limit:   true,
			want:    Decision{Verb: VerbRelease, Err: errLimit},
			writes:  []Op{OpFail},
			states:  []State{StateReceived, StateRunning, StateReleasing, StateReleased},
		},
		{
			name:    "past the limit, the ledger down: released uncounted",
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{}, {err: errDBDown}},
			limit:   true,
			want:    Decision{Verb: VerbRelease, Err: errLimit},
			writes:  []Op{OpBegin, OpFailBegun},
			states:  []State{StateReceived, StateChecking, StateRunning, StateReleasing, StateReleased},
		},
		{
			name:    "no id: dead-lettered, reported",
			arrival: Arrival{MaybeRedelivered: true},
			want:    Decision{Verb: VerbDeadLetter, Err: ErrNoMessageID, Report: true},
			states:  []State{StateReceived, StateDeadLettering, StateDeadLettered},
		},
		{
			name:    "no id, and the dead letter fails: back after the first delay, nothing to keep",
			arrival: Arrival{},
			dlErr:   errBoom,
			want:    Decision{Verb: VerbDeadLetter, Err: ErrNoMessageID, Report: true},
			after:   Decision{Verb: VerbRequeue, Delay: time.Second, Err: fmt.Errorf("inbox: dead letter: %w", errBoom)},
			states:  []State{StateReceived, StateDeadLettering, StateDeadLetterFailed},
		},
		{
			name:    "no id, stop policy: the consumer stops",
			policy:  Policy{NoID: NoIDStop},
			arrival: Arrival{},
			want:    Decision{Verb: VerbStop, Err: ErrNoMessageID},
			states:  []State{StateReceived, StateStopped},
		},
		{
			name:    "no limit: never dead-lettered, reported past the default",
			policy:  Policy{Retry: Retry{MaxDeliveries: -1}},
			arrival: Arrival{HasID: true, MaybeRedelivered: true},
			answers: []answer{{rec: Record{Failures: 40, Running: 3}}, {rec: Record{Failures: 44, Running: 2}}},
			ending:  Ending{Err: errBoom},
			want:    Decision{Verb: VerbRequeue, Delay: DefaultMaxRetryDelay, Err: errBoom, Failures: 46, Report: true},
			writes:  []Op{OpBegin, OpFailBegun},
			states:  []State{StateReceived, StateChecking, StateRunning, StateFailing, StateRetrying},
		},
	}
	visited := map[Move]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pol := tt.policy
			if pol == (Policy{}) {
				pol = p
			}
			got, after, writes, states := play(t, pol, tt.arrival, tt.answers, tt.limit, tt.ending, tt.dlErr)
			if tt.want.Err != nil {
				assert.EqualError(t, got.Err, tt.want.Err.Error())
				got.Err, tt.want.Err = nil, nil
			}
			if tt.after.Err != nil {
				assert.EqualError(t, after.Err, tt.after.Err.Error())
				assert.ErrorIs(t, after.Err, tt.dlErr)
				after.Err, tt.after.Err = nil, nil
			}
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.after, after)
			assert.Equal(t, tt.writes, writes)
			assert.Equal(t, tt.states, states)
			for i := 1; i < len(states); i++ {
				visited[Move{states[i-1], states[i]}] = true
			}
		})
	}
	for from, tos := range moves {
		for _, to := range tos {
			assert.True(t, visited[Move{State(from), to}], "no case moves %s -> %s", State(from), to)
		}
	}
}

// The moves that must never happen: the core refuses each, keeps its
// state, and decides nothing a shell could act on. Checked to fail with
// Returned accepting any state (the delivery that never ran was acked).
func TestCoreRefusesWhatMustNeverHappen(t *testing.T) {
	saved := coreBug
	coreBug = nil // these are made on purpose
	defer func() { coreBug = saved }()
	tests := []struct {
		name string
		from func(d *Delivery)
		call func(d *Delivery) Decision
	}{
		{"ack a delivery that never ran", func(*Delivery) {}, func(d *Delivery) Decision { return d.Returned(Ending{}) }},
		{"arrive twice", func(d *Delivery) { d.Arrive(Arrival{HasID: true}) }, func(d *Delivery) Decision { return d.Arrive(Arrival{HasID: true}) }},
		{"an answer nobody asked for", func(d *Delivery) { d.Arrive(Arrival{HasID: true}) }, func(d *Delivery) Decision { return d.Recorded(Record{Processed: true}, nil) }},
		{"ack after a counted failure", func(d *Delivery) {
			d.Arrive(Arrival{HasID: true})
			d.Returned(Ending{Err: errBoom})
			d.Recorded(Record{Failures: 1}, nil)
		}, func(d *Delivery) Decision { return d.Returned(Ending{}) }},
		{"run after a dead letter", func(d *Delivery) { d.Arrive(Arrival{}) }, func(d *Delivery) Decision { return d.LimitPassed() }},
		{"a dead letter reported of a delivery never dead-lettered", func(d *Delivery) { d.Arrive(Arrival{HasID: true}) }, func(d *Delivery) Decision { return d.DeadLettered(nil) }},
		{"a dead letter reported twice", func(d *Delivery) {
			d.Arrive(Arrival{})
			d.DeadLettered(nil)
		}, func(d *Delivery) Decision { return d.DeadLettered(nil) }},
		{"limit on a handed-back delivery", func(d *Delivery) { d.Arrive(Arrival{HasID: true, Stopping: true}) }, func(d *Delivery) Decision { return d.LimitPassed() }},
		{"return while the marker is written", func(d *Delivery) { d.Arrive(Arrival{HasID: true, MaybeRedelivered: true}) }, func(d *Delivery) Decision { return d.Returned(Ending{}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDelivery(Policy{})
			tt.from(d)
			before := d.State()
			dec := tt.call(d)
			assert.Equal(t, before, d.State(), "the delivery keeps its state")
			assert.Equal(t, VerbNone, dec.Verb)
			assert.Equal(t, OpNone, dec.Write)
			assert.ErrorIs(t, dec.Err, errRefused)
			assert.Len(t, d.Refused(), 1)
		})
	}
	// And the table itself: nothing leaves a final state, and no
	// failure, shutdown or hand-back leads to an ack.
	for s := StateAcked; s < stateCount; s++ {
		assert.Empty(t, moves[s], "%s is final", s)
	}
	for _, from := range []State{StateFailing, StateReleasing} {
		assert.NotContains(t, moves[from], StateAcked, "%s never acks", from)
	}
	assert.NotContains(t, moves[StateReceived], StateAcked, "nothing is acked unrun and unchecked")
}
