package idemhttp

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// journalSampleEntries are encoder inputs covering every field's edge
// cases; they also seed FuzzDecodeEntry.
func journalSampleEntries() []*Entry {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	return []*Entry{
		{Key: "k", State: StatePending},
		{
			Operation:   "order-42",
			Key:         "7f8e2f9a-1c3b-4d5e-8f60-718293a4b5c6",
			Method:      http.MethodPost,
			URL:         "https://api.example.com/v1/charges?expand=customer",
			Header:      http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}},
			Body:        []byte(`{"amount":100}`),
			Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Created:     t0,
			Updated:     t0.Add(time.Second),
			Attempts:    3,
			LastStatus:  503,
			State:       StatePending,
		},
		{Key: "done", State: StateDone, Body: []byte{}, LastStatus: 201, Attempts: 1, Created: t0, Updated: t0},
		{Key: "abandoned", State: StateAbandoned, Body: bytes.Repeat([]byte{0, 0xff}, 300), Created: time.Unix(-1, 5).UTC()},
		{Key: "far", State: StateDone, Created: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
	}
}

func TestJournalCodecRoundTrip(t *testing.T) {
	for _, give := range journalSampleEntries() {
		t.Run(give.Key, func(t *testing.T) {
			state, request, err := journalEncodeEntry(give)
			require.NoError(t, err)
			got, err := journalDecodeEntry(state, request)
			require.NoError(t, err)
			assert.Equal(t, give, got)
		})
	}
}

func TestJournalCodecZeroTimes(t *testing.T) {
	state, request, err := journalEncodeEntry(&Entry{Key: "k", State: StatePending})
	require.NoError(t, err)
	got, err := journalDecodeEntry(state, request)
	require.NoError(t, err)
	assert.True(t, got.Created.IsZero())
	assert.True(t, got.Updated.IsZero())
	assert.Nil(t, got.Header)
	assert.Nil(t, got.Body)
}

func TestJournalCodecUnknownState(t *testing.T) {
	_, _, err := journalEncodeEntry(&Entry{Key: "k", State: "lost"})
	assert.Error(t, err)
}

// Finish rewrites only the tail of a state record, after the head it
// copies: the result must decode like a record encoded whole.
func TestJournalCodecRewriteTail(t *testing.T) {
	give := journalSampleEntries()[1]
	state, _, err := journalEncodeEntry(give)
	require.NoError(t, err)
	s, err := journalDecodeState(state)
	require.NoError(t, err)

	at := give.Updated.Add(time.Minute)
	rewritten := journalAppendStateTail(bytes.Clone(s.head), journalStateDone, s.created, at, s.attempts+1, 201)
	want := *give
	want.State, want.Updated, want.Attempts, want.LastStatus = StateDone, at, give.Attempts+1, 201
	wantState, _, err := journalEncodeEntry(&want)
	require.NoError(t, err)
	assert.Equal(t, wantState, rewritten)
}

// journalSeal appends the CRC that seals payload as a record.
func journalSeal(payload ...byte) []byte {
	return binary.LittleEndian.AppendUint32(bytes.Clone(payload), crc32.Checksum(payload, journalCRC))
}

func TestJournalDecodeRejects(t *testing.T) {
	validState, validRequest, err := journalEncodeEntry(journalSampleEntries()[1])
	require.NoError(t, err)
	statePayload := validState[:len(validState)-journalCRCLen]
	requestPayload := validRequest[:len(validRequest)-journalCRCLen]
	flipped := bytes.Clone(validRequest)
	flipped[len(flipped)/2] ^= 0x20
	// A minimal state record for key "k", and its request record.
	minState := journalSeal(2, 's', 1, 'k', 0, 0, 1, 0, 0, 0, 0, 0, 0)
	minRequest := journalSeal(2, 'r', 1, 'k', 0, 0, 0, 0)
	// A version 1 record, as the previous format stored whole entries.
	v1 := journalSeal(1, 1, 'k', 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0)
	tests := []struct {
		name    string
		state   []byte
		request []byte
		want    string
	}{
		{name: "empty", state: nil, request: minRequest, want: "too short"},
		{name: "short", state: []byte{2, 's', 3}, request: minRequest, want: "too short"},
		{name: "flipped byte", state: validState, request: flipped, want: "checksum"},
		{name: "truncated", state: validState[:len(validState)-7], request: validRequest, want: "checksum"},
		{name: "version 1", state: v1, request: minRequest, want: "version 1"},
		{name: "future version", state: journalSeal(append([]byte{3}, statePayload[1:]...)...), request: validRequest, want: "version 3"},
		{name: "request as state", state: validRequest, request: validRequest, want: "kind"},
		{name: "state as request", state: validState, request: validState, want: "kind"},
		{name: "truncated state", state: journalSeal(statePayload[:len(statePayload)-3]...), request: validRequest, want: "bad varint"},
		{name: "truncated request", state: validState, request: journalSeal(requestPayload[:len(requestPayload)-3]...), want: "exceeds"},
		{name: "trailing bytes", state: journalSeal(append(bytes.Clone(statePayload), 0)...), request: validRequest, want: "trailing"},
		{name: "trailing request bytes", state: validState, request: journalSeal(append(bytes.Clone(requestPayload), 0)...), want: "trailing"},
		{name: "huge length", state: journalSeal(2, 's', 0xff, 0xff, 0xff, 0xff, 0x0f), request: minRequest, want: "exceeds"},
		{name: "bad varint", state: journalSeal(2, 's', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), request: minRequest, want: "bad varint"},
		{name: "unknown state", state: journalSeal(2, 's', 1, 'k', 0, 0, 9), request: minRequest, want: "state byte 9"},
		{name: "bad nanoseconds", state: journalSeal(2, 's', 1, 'k', 0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f), request: minRequest, want: "nanoseconds"},
		{name: "negative attempts", state: journalSeal(2, 's', 1, 'k', 0, 0, 1, 0, 0, 0, 0, 1, 0), request: minRequest, want: "negative attempts"},
		{name: "request of another key", state: minState, request: journalSeal(2, 'r', 1, 'j', 0, 0, 0, 0), want: "request of key"},
		{name: "huge header count", state: minState, request: journalSeal(2, 'r', 1, 'k', 0, 0, 0xff, 0x7f), want: "count"},
		{name: "bad body flag", state: minState, request: journalSeal(2, 'r', 1, 'k', 0, 0, 0, 7), want: "body flag"},
		{name: "repeated header", state: minState, request: journalSeal(2, 'r', 1, 'k', 0, 0, 2, 1, 'A', 1, 0, 1, 'A', 1, 0, 0), want: "repeated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := journalDecodeEntry(tt.state, tt.request)
			assert.Nil(t, got)
			assert.ErrorIs(t, err, ErrJournalCorrupt)
			assert.ErrorContains(t, err, tt.want)
		})
	}
	got, err := journalDecodeEntry(minState, minRequest)
	require.NoError(t, err, "the minimal records are valid")
	assert.Equal(t, &Entry{Key: "k", State: StatePending, Created: time.Unix(0, 0).UTC(), Updated: time.Unix(0, 0).UTC()}, got)
}

// FuzzDecodeEntry checks that no pair of state and request records makes
// the decoder panic or over-allocate, that every rejection wraps
// ErrJournalCorrupt, and that whatever it accepts survives a second round
// trip unchanged. The fuzzer cannot forge a CRC, so each input is also
// tried sealed with its own.
func FuzzDecodeEntry(f *testing.F) {
	for _, e := range journalSampleEntries() {
		state, request, err := journalEncodeEntry(e)
		require.NoError(f, err)
		f.Add(state, request)
		f.Add(state[:len(state)-journalCRCLen], request[:len(request)-journalCRCLen])
	}
	f.Fuzz(func(t *testing.T, state, request []byte) {
		journalCheckDecode(t, state, request)
		journalCheckDecode(t, journalSeal(state...), journalSeal(request...))
	})
}

func journalCheckDecode(t *testing.T, state, request []byte) {
	e, err := journalDecodeEntry(state, request)
	if err != nil {
		require.ErrorIs(t, err, ErrJournalCorrupt)
		require.Nil(t, e)
		return
	}
	state2, request2, err := journalEncodeEntry(e)
	require.NoError(t, err)
	e2, err := journalDecodeEntry(state2, request2)
	require.NoError(t, err)
	require.Equal(t, e, e2)
}

func journalOpenTest(t *testing.T) *FileJournal {
	t.Helper()
	j, err := OpenFileJournal(filepath.Join(t.TempDir(), "journal.db"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, j.Close()) })
	return j
}

// journalBeginOp returns an op that inserts a bare pending entry for key,
// the way Begin does.
func journalBeginOp(key string) *journalOp {
	e := &Entry{Key: key, State: StatePending, Created: time.Unix(1, 0)}
	state, request, err := journalEncodeEntry(e)
	if err != nil {
		panic(err)
	}
	return &journalOp{apply: func(tx *bolt.Tx, op *journalOp) error {
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		op.changed = true
		n, err := b.requests.NextSequence()
		if err != nil {
			return err
		}
		seq := journalSeqKey(n)
		if err := b.requests.Put(seq, request); err != nil {
			return err
		}
		if err := b.states.Put(seq, state); err != nil {
			return err
		}
		if err := b.keys.Put([]byte(key), seq); err != nil {
			return err
		}
		return b.pending.Put(journalTimeKey(e.Created, []byte(key)), seq)
	}}
}

// journalFailingOp fails after changing the transaction: bbolt refuses an
// empty key only once the op has started writing.
func journalFailingOp() *journalOp {
	return &journalOp{apply: func(tx *bolt.Tx, op *journalOp) error {
		op.changed = true
		if err := tx.Bucket(journalDone).Put([]byte("half"), []byte{1}); err != nil {
			return err
		}
		return tx.Bucket(journalKeys).Put(nil, []byte("x"))
	}}
}

// Regression: one failing op in a group commit must fail alone; the
// others commit together, as with bbolt's DB.Batch.
func TestJournalCommitIsolatesFailingOp(t *testing.T) {
	j := journalOpenTest(t)
	ctx := context.Background()
	a, bad, c := journalBeginOp("a"), journalFailingOp(), journalBeginOp("c")
	finishUnknown := &journalOp{apply: func(tx *bolt.Tx, op *journalOp) error {
		b, err := journalBuckets(tx)
		if err != nil {
			return err
		}
		_, err = b.get([]byte("nope"))
		return err
	}}

	j.commit([]*journalOp{a, finishUnknown, bad, c})

	assert.NoError(t, a.err)
	assert.NoError(t, c.err)
	assert.ErrorIs(t, finishUnknown.err, ErrNotFound)
	assert.ErrorIs(t, bad.err, berrors.ErrKeyRequired)
	// The failed batch and the failed solo run commit nothing; the retry of
	// the rest is one commit.
	assert.Equal(t, JournalStats{Writes: 4, Commits: 1}, j.Stats())
	for _, key := range []string{"a", "c"} {
		_, err := j.Get(ctx, key)
		assert.NoError(t, err, key)
	}
	require.NoError(t, j.Verify(ctx), "the failing op's half write was rolled back")
}

func TestJournalCommitPanicStopsWrites(t *testing.T) {
	j := journalOpenTest(t)
	ctx := context.Background()
	_, err := j.Begin(ctx, &Entry{Key: "before"})
	require.NoError(t, err)

	boom := &journalOp{apply: func(*bolt.Tx, *journalOp) error { panic("invalid page type") }}
	other := journalBeginOp("other")
	j.commit([]*journalOp{other, boom})

	assert.ErrorIs(t, boom.err, ErrJournalCorrupt)
	assert.ErrorIs(t, other.err, ErrJournalCorrupt)
	_, err = j.Begin(ctx, &Entry{Key: "after"})
	assert.ErrorIs(t, err, ErrJournalCorrupt, "writes stay stopped")
	_, err = j.Get(ctx, "before")
	assert.NoError(t, err, "reads go on")
	_, err = j.Get(ctx, "other")
	assert.ErrorIs(t, err, ErrNotFound, "the panicking batch was rolled back")
}

// A writer whose context ends while it waits behind another commit leaves
// the queue without writing; one already taken into a batch waits for it.
func TestJournalSubmitCancelledWhileQueued(t *testing.T) {
	j := journalOpenTest(t)
	// Pose as a leader in the middle of a commit.
	j.mu.Lock()
	j.committing = true
	j.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := j.Begin(ctx, &Entry{Key: "queued"})
		done <- err
	}()
	journalWaitQueued(t, j, 1)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)

	j.mu.Lock()
	assert.Empty(t, j.queue)
	j.committing = false
	j.mu.Unlock()
	_, err := j.Get(context.Background(), "queued")
	assert.ErrorIs(t, err, ErrNotFound)
}

// A queued writer is woken to lead the next batch when the running commit
// ends, and takes every writer queued behind it along.
func TestJournalSubmitHandsOverLeadership(t *testing.T) {
	j := journalOpenTest(t)
	j.mu.Lock()
	j.committing = true
	j.mu.Unlock()

	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := j.Begin(context.Background(), &Entry{Key: string(rune('a' + i))})
			errs <- err
		}()
	}
	journalWaitQueued(t, j, n)

	// End the pretended commit: lead hands the queue on when its batch is
	// done.
	noop := &journalOp{apply: func(*bolt.Tx, *journalOp) error { return nil }}
	j.lead(noop, []*journalOp{noop})

	for range n {
		assert.NoError(t, <-errs)
	}
	assert.Equal(t, JournalStats{Writes: 1 + n, Commits: 1}, j.Stats(), "the queued writers shared one commit")
	pending, err := j.Pending(context.Background())
	require.NoError(t, err)
	assert.Len(t, pending, n)
}

// journalWaitQueued waits until n writers are queued. The queue is
// internal state with no event to wait on, so it polls, briefly.
func journalWaitQueued(t *testing.T, j *FileJournal, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.queue) == n
	}, 5*time.Second, time.Millisecond)
}

func TestJournalTimeKeyOrder(t *testing.T) {
	times := []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(-1, 999999999),
		time.Unix(0, 0),
		time.Unix(0, 1),
		time.Unix(1, 0),
		time.Date(2262, 4, 12, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	for i := 1; i < len(times); i++ {
		assert.Negative(t, bytes.Compare(journalTimeKey(times[i-1], []byte("z")), journalTimeKey(times[i], []byte("a"))), "%v < %v", times[i-1], times[i])
	}
}

func TestJournalRedactURL(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr bool
	}{
		{give: "https://api.example.com/v1/charges", want: "https://api.example.com/v1/charges"},
		{give: "https://user:hunter2@api.example.com/x?q=1", want: "https://user@api.example.com/x?q=1"},
		{give: "https://user@api.example.com/x", want: "https://user@api.example.com/x"},
		{give: "https://:hunter2@api.example.com/", want: "https://@api.example.com/"},
		{give: "", want: ""},
		{give: "https://user:hunter2@api.example.com/%zz", wantErr: true},
	}
	for _, tt := range tests {
		got, err := journalRedactURL(tt.give)
		assert.Equal(t, tt.want, got, tt.give)
		assert.Equal(t, tt.wantErr, err != nil, tt.give)
		if err != nil {
			assert.NotContains(t, err.Error(), "hunter2")
		}
	}
}

func TestJournalProtectRecoversPanic(t *testing.T) {
	panicked, err := journalProtect(func() error { panic("invalid page type") })
	assert.True(t, panicked)
	assert.ErrorIs(t, err, ErrJournalCorrupt)
	assert.ErrorContains(t, err, "invalid page type")

	panicked, err = journalProtect(func() error { return ErrNotFound })
	assert.False(t, panicked)
	assert.ErrorIs(t, err, ErrNotFound)
}
