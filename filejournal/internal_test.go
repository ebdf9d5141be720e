package filejournal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
)

// Helpers here start with ij (internal journal) so that they cannot clash
// with the external tests' fj helpers.

// ijCodecCase is an entry given to the begin record encoder and the entry
// its record decodes back to.
type ijCodecCase struct {
	name string
	give *idemhttp.Entry
	want *idemhttp.Entry
}

// ijSampleEntries cover every begin field's edge cases; they also seed
// FuzzDecodeRecord and FuzzJournalIndex.
func ijSampleEntries() []ijCodecCase {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 123456789, time.UTC)
	full := &idemhttp.Entry{
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
		State:       idemhttp.StatePending,
	}
	minimal := &idemhttp.Entry{Key: "k", State: idemhttp.StatePending}
	emptyBody := &idemhttp.Entry{Key: "done", State: idemhttp.StateDone, Body: []byte{}, LastStatus: 201, Attempts: 1, Created: t0, Updated: t0}
	binaryBody := &idemhttp.Entry{
		Key: "abandoned", State: idemhttp.StateAbandoned, Body: bytes.Repeat([]byte{0, 0xff}, 300),
		Created: time.Unix(-1, 5).UTC(), Updated: time.Unix(-3_000_000_000, 999_999_999).UTC(),
	}
	far := &idemhttp.Entry{Key: "far", State: idemhttp.StateDone, Created: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)}
	nearZero := &idemhttp.Entry{Key: "near-zero", State: idemhttp.StatePending, Created: time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC), Updated: time.Unix(0, 0).UTC()}
	extremes := &idemhttp.Entry{Key: "extremes", State: idemhttp.StateDone, Attempts: math.MaxInt64, LastStatus: -1}
	lowercase := &idemhttp.Entry{Key: "lowercase", State: idemhttp.StatePending, Header: http.Header{"x-not-canonical": {"kept as given"}}}
	zone := time.FixedZone("UTC+1", 3600)
	withResult := &idemhttp.Entry{
		Key: "kept", Operation: "op-kept", Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
		Body: []byte(`{"amount":100}`), State: idemhttp.StateDone, LastStatus: 201, Attempts: 1, Created: t0, Updated: t0,
		Result: &idemhttp.Result{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)},
	}
	emptyResult := &idemhttp.Entry{Key: "kept-empty", State: idemhttp.StateDone, LastStatus: 204, Result: &idemhttp.Result{Status: 204, Body: []byte{}}}
	return []ijCodecCase{
		{name: "minimal", give: minimal, want: minimal},
		{name: "done with its result (a result record)", give: withResult, want: withResult},
		{name: "a result without headers or body", give: emptyResult, want: emptyResult},
		{name: "full", give: full, want: full},
		{name: "done with empty body", give: emptyBody, want: emptyBody},
		{name: "abandoned with binary body before 1970", give: binaryBody, want: binaryBody},
		{name: "far future", give: far, want: far},
		{name: "one nanosecond after the zero time", give: nearZero, want: nearZero},
		{name: "extreme counters", give: extremes, want: extremes},
		{name: "header name kept as given", give: lowercase, want: lowercase},
		{
			name: "empty header decodes as nil",
			give: &idemhttp.Entry{Key: "empty-header", State: idemhttp.StatePending, Header: http.Header{}},
			want: &idemhttp.Entry{Key: "empty-header", State: idemhttp.StatePending},
		},
		{
			// A name without values carries nothing: the encoder drops it.
			name: "names without values dropped",
			give: &idemhttp.Entry{Key: "valueless", State: idemhttp.StatePending, Header: http.Header{"Accept": {"*/*"}, "X-Empty": {}, "X-Nil": nil}},
			want: &idemhttp.Entry{Key: "valueless", State: idemhttp.StatePending, Header: http.Header{"Accept": {"*/*"}}},
		},
		{
			name: "times come back in UTC",
			give: &idemhttp.Entry{Key: "zoned", State: idemhttp.StatePending, Created: time.Date(2025, 1, 2, 3, 4, 5, 6, zone)},
			want: &idemhttp.Entry{Key: "zoned", State: idemhttp.StatePending, Created: time.Date(2025, 1, 2, 2, 4, 5, 6, time.UTC)},
		},
	}
}

// ijDecodeFramed reads the one record in b and decodes it.
func ijDecodeFramed(t testing.TB, b []byte) *record {
	t.Helper()
	payload, n, ok := readRecord(b)
	require.True(t, ok, "fjReadRecord")
	require.Equal(t, len(b), n, "record length")
	rec, err := decodeRecord(payload)
	require.NoError(t, err)
	return rec
}

func TestJournalCodecBeginRoundTrip(t *testing.T) {
	for _, tt := range ijSampleEntries() {
		t.Run(tt.name, func(t *testing.T) {
			b, err := appendBegin(nil, tt.give)
			require.NoError(t, err)
			rec := ijDecodeFramed(t, b)
			want := byte(kindBegin)
			if tt.give.Result != nil {
				want = kindResult
			}
			assert.Equal(t, want, rec.kind)
			assert.Equal(t, tt.want, rec.entry())
		})
	}
}

func TestJournalCodecBeginKeepsNilAndEmptyBodiesApart(t *testing.T) {
	b, err := appendBegin(nil, &idemhttp.Entry{Key: "nil", State: idemhttp.StatePending})
	require.NoError(t, err)
	assert.Nil(t, ijDecodeFramed(t, b).entry().Body, "nil body: not stored")

	b, err = appendBegin(nil, &idemhttp.Entry{Key: "empty", State: idemhttp.StatePending, Body: []byte{}})
	require.NoError(t, err)
	got := ijDecodeFramed(t, b).entry().Body
	assert.NotNil(t, got, "empty body: stored, and empty")
	assert.Empty(t, got)
}

func TestJournalCodecBeginAppends(t *testing.T) {
	prefix := []byte("earlier records")
	b, err := appendBegin(bytes.Clone(prefix), ijSampleEntries()[1].give)
	require.NoError(t, err)
	assert.Equal(t, prefix, b[:len(prefix)], "what was in dst is kept")
	assert.Equal(t, ijSampleEntries()[1].want, ijDecodeFramed(t, b[len(prefix):]).entry())
}

func TestJournalCodecFinishAndDeleteRoundTrip(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 5, time.UTC)
	tests := []struct {
		name string
		give []byte
		want *record
	}{
		{
			name: "finish done",
			give: appendFinish(nil, "k", journalStateDone, 201, 2, t0),
			want: &record{kind: kindFinish, key: "k", state: journalStateDone, lastStatus: 201, attempts: 2, updated: t0},
		},
		{
			name: "finish pending again",
			give: appendFinish(nil, "k", journalStatePending, 0, 7, time.Unix(-5, 0).UTC()),
			want: &record{kind: kindFinish, key: "k", state: journalStatePending, attempts: 7, updated: time.Unix(-5, 0).UTC()},
		},
		{
			name: "finish abandoned at the zero time",
			give: appendFinish(nil, "k", journalStateAbandoned, -1, math.MaxInt64, time.Time{}),
			want: &record{kind: kindFinish, key: "k", state: journalStateAbandoned, lastStatus: -1, attempts: math.MaxInt64},
		},
		{
			name: "delete",
			give: appendDelete(nil, "7f8e2f9a-1c3b-4d5e-8f60-718293a4b5c6"),
			want: &record{kind: kindDelete, key: "7f8e2f9a-1c3b-4d5e-8f60-718293a4b5c6"},
		},
		{
			name: "clock",
			give: appendClock(nil, t0),
			want: &record{kind: kindClock, updated: t0},
		},
		{
			name: "clock before 1970",
			give: appendClock(nil, time.Unix(-3_000_000_000, 999_999_999).UTC()),
			want: &record{kind: kindClock, updated: time.Unix(-3_000_000_000, 999_999_999).UTC()},
		},
		{
			name: "clock at the zero time",
			give: appendClock(nil, time.Time{}),
			want: &record{kind: kindClock},
		},
		{
			name: "clock far ahead",
			give: appendClock(nil, time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)),
			want: &record{kind: kindClock, updated: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, ijDecodeFramed(t, tt.give))
		})
	}
}

func TestJournalCodecBeginRefuses(t *testing.T) {
	// Header values share one string, so the entry is over the limit
	// without holding 64 MiB.
	mib := strings.Repeat("v", 1<<20)
	tooLarge := &idemhttp.Entry{Key: "k", State: idemhttp.StatePending, Header: http.Header{"X-Big": slices.Repeat([]string{mib}, maxRecord>>20+1)}}
	tests := []struct {
		name string
		give *idemhttp.Entry
		want string
	}{
		{name: "unknown state", give: &idemhttp.Entry{Key: "k", State: "lost"}, want: `unknown state "lost"`},
		{name: "empty state", give: &idemhttp.Entry{Key: "k"}, want: `unknown state ""`},
		{name: "too large", give: tooLarge, want: "too large for the journal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := []byte("kept")
			got, err := appendBegin(dst, tt.give)
			assert.ErrorContains(t, err, tt.want)
			assert.Equal(t, []byte("kept"), got, "dst is returned unchanged")
		})
	}
	_, err := appendBegin(nil, tooLarge)
	assert.ErrorIs(t, err, idemhttp.ErrInvalidRequest, "an entry too large is the caller's error")
}

// ijWidest is an entry whose every fixed-width field takes its widest
// encoding: 10-byte varints for the times' seconds, attempts and status,
// 5-byte nanoseconds, and two-byte length prefixes on every string. It
// has no header, whose per-name allowance in beginSize would hide the
// difference.
func ijWidest(bodyLen int) *idemhttp.Entry {
	long := strings.Repeat("x", 200)
	return &idemhttp.Entry{
		Key: strings.Repeat("k", idemhttp.MaxKeyLen), Operation: long, Method: long, URL: long, Fingerprint: long,
		Created: time.Unix(math.MinInt64+1<<40, 999_999_999), Updated: time.Unix(math.MaxInt64-1<<40, 999_999_999),
		Attempts: math.MaxInt64, LastStatus: math.MinInt64, State: idemhttp.StateAbandoned, Body: make([]byte, bodyLen),
	}
}

// beginSize's bound is what keeps appendBegin from writing a record
// that readRecord refuses (above maxRecord), and so a journal that
// cannot be opened again.
func TestJournalCodecBeginSizeIsAnUpperBound(t *testing.T) {
	tests := []struct {
		name string
		give *idemhttp.Entry
	}{
		{name: "minimal", give: &idemhttp.Entry{Key: "k", State: idemhttp.StatePending}},
		{name: "full", give: ijSampleEntries()[1].give},
		{name: "widest fields", give: ijWidest(200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			size, _ := beginSize(tt.give)
			b, err := appendBegin(nil, tt.give)
			require.NoError(t, err)
			assert.LessOrEqual(t, len(b)-recHdrLen, size)
		})
	}
}

// Regression: an entry that appendBegin accepts must give a record that
// readRecord accepts; one just under the limit by beginSize's
// estimate came out just over it, so Get and Open refused it
// as corrupt.
func TestJournalCodecBeginAtTheLimitIsReadable(t *testing.T) {
	e := ijWidest(0)
	fixed, _ := beginSize(e)
	e.Body = make([]byte, maxRecord-fixed) // estimated at exactly maxRecord
	b, err := appendBegin(nil, e)
	require.NoError(t, err)
	_, _, ok := readRecord(b)
	assert.True(t, ok, "a %d-byte payload, limit %d", len(b)-recHdrLen, maxRecord)
}

// ijStr, ijUv and ijV encode one field of a payload.
func ijStr(s string) []byte    { return journalAppendString(nil, s) }
func ijUv(v uint64) []byte     { return binary.AppendUvarint(nil, v) }
func ijV(v int64) []byte       { return binary.AppendVarint(nil, v) }
func ijCat(p ...[]byte) []byte { return slices.Concat(p...) }

// ijEpoch is a time field holding the Unix epoch.
var ijEpoch = []byte{0, 0}

// ijBeginPayload is a begin payload for key with empty strings, the given
// header field, times at the Unix epoch, zero status, and the given state,
// attempts and body field.
func ijBeginPayload(key string, header []byte, state byte, attempts int64, body []byte) []byte {
	return ijCat([]byte{kindBegin}, ijStr(key), ijStr(""), ijStr(""), ijStr(""), ijStr(""),
		header, ijEpoch, ijEpoch, []byte{state}, ijV(attempts), ijV(0), body)
}

// ijFinishPayload is a finish payload with zero status.
func ijFinishPayload(key string, state byte, attempts int64, updated []byte) []byte {
	return ijCat([]byte{kindFinish}, ijStr(key), []byte{state}, ijV(0), ijV(attempts), updated)
}

// ijHeader encodes a header field with one value "v" per name, in the
// order given.
func ijHeader(names ...string) []byte {
	b := ijUv(uint64(len(names)))
	for _, n := range names {
		b = ijCat(b, ijStr(n), ijUv(1), ijStr("v"))
	}
	return b
}

var (
	ijNoHeader = ijUv(0)
	ijNoBody   = []byte{0}
)

func TestJournalDecodeRecordAccepts(t *testing.T) {
	epoch := time.Unix(0, 0).UTC()
	tests := []struct {
		name string
		give []byte
		want *record
	}{
		{
			name: "minimal begin",
			give: ijBeginPayload("k", ijNoHeader, journalStatePending, 0, ijNoBody),
			want: &record{kind: kindBegin, key: "k", created: epoch, updated: epoch, state: journalStatePending},
		},
		{
			name: "begin with sorted header and body",
			give: ijBeginPayload("k", ijHeader("A", "B"), journalStateDone, 2, ijCat([]byte{1}, ijStr("abc"))),
			want: &record{
				kind: kindBegin, key: "k", header: http.Header{"A": {"v"}, "B": {"v"}}, created: epoch, updated: epoch,
				state: journalStateDone, attempts: 2, hasBody: true, body: []byte("abc"),
			},
		},
		{
			name: "zero time",
			give: ijFinishPayload("k", journalStateAbandoned, 1, ijCat(ijV(time.Time{}.Unix()), ijUv(0))),
			want: &record{kind: kindFinish, key: "k", state: journalStateAbandoned, attempts: 1},
		},
		{
			name: "non-minimal varints",
			give: ijFinishPayload("k", journalStateDone, 1, []byte{0x80, 0x00, 0x80, 0x00}),
			want: &record{kind: kindFinish, key: "k", state: journalStateDone, attempts: 1, updated: epoch},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeRecord(tt.give)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestJournalDecodeRecordRejects(t *testing.T) {
	begin := ijBeginPayload("k", ijNoHeader, journalStatePending, 0, ijNoBody)
	finish := ijFinishPayload("k", journalStateDone, 0, ijEpoch)
	deletion := ijCat([]byte{kindDelete}, ijStr("k"))
	tooLong := strings.Repeat("k", idemhttp.MaxKeyLen+1)
	overflow := bytes.Repeat([]byte{0xff}, 11) // no varint is 11 bytes long
	tests := []struct {
		name string
		give []byte
		want string
	}{
		{name: "empty", give: nil, want: "truncated"},
		{name: "unknown kind", give: ijCat([]byte{'X'}, ijStr("k")), want: "unknown record kind"},
		{name: "lowercase kind", give: ijCat([]byte{'b'}, begin[1:]), want: "unknown record kind"},
		{name: "begin state 0", give: ijBeginPayload("k", ijNoHeader, 0, 0, ijNoBody), want: "state byte 0"},
		{name: "begin state 4", give: ijBeginPayload("k", ijNoHeader, 4, 0, ijNoBody), want: "state byte 4"},
		{name: "finish state 0", give: ijFinishPayload("k", 0, 0, ijEpoch), want: "state byte 0"},
		{name: "finish state 255", give: ijFinishPayload("k", 255, 0, ijEpoch), want: "state byte 255"},
		{name: "begin trailing byte", give: ijCat(begin, []byte{0}), want: "1 trailing bytes"},
		{name: "finish trailing bytes", give: ijCat(finish, []byte{0, 0}), want: "2 trailing bytes"},
		{name: "delete trailing byte", give: ijCat(deletion, []byte{'x'}), want: "trailing"},
		{name: "header out of order", give: ijBeginPayload("k", ijHeader("B", "A"), journalStatePending, 0, ijNoBody), want: "out of order"},
		{name: "header repeated", give: ijBeginPayload("k", ijHeader("A", "A"), journalStatePending, 0, ijNoBody), want: "repeated"},
		{name: "header case differs only", give: ijBeginPayload("k", ijHeader("a", "A"), journalStatePending, 0, ijNoBody), want: "out of order"},
		{name: "header without values", give: ijBeginPayload("k", ijCat(ijUv(1), ijStr("A"), ijUv(0)), journalStatePending, 0, ijNoBody), want: "empty"},
		{name: "huge header count", give: ijBeginPayload("k", ijUv(1<<40), journalStatePending, 0, ijNoBody), want: "count"},
		{name: "huge value count", give: ijBeginPayload("k", ijCat(ijUv(1), ijStr("A"), ijUv(math.MaxUint64)), journalStatePending, 0, ijNoBody), want: "count"},
		{name: "huge string length", give: ijCat([]byte{kindDelete}, ijUv(math.MaxUint64), []byte("k")), want: "exceeds"},
		{name: "string past the end", give: ijCat([]byte{kindDelete}, ijUv(2), []byte("k")), want: "exceeds"},
		{name: "varint overflow", give: ijCat([]byte{kindFinish}, ijStr("k"), []byte{journalStateDone}, overflow), want: "bad varint"},
		{name: "nanoseconds out of range", give: ijFinishPayload("k", journalStateDone, 0, ijCat(ijV(0), ijUv(uint64(time.Second)))), want: "nanoseconds"},
		{name: "body flag 2", give: ijBeginPayload("k", ijNoHeader, journalStatePending, 0, []byte{2}), want: "body flag"},
		{name: "body flag missing", give: ijBeginPayload("k", ijNoHeader, journalStatePending, 0, nil), want: "truncated"},
		{name: "body past the end", give: ijBeginPayload("k", ijNoHeader, journalStatePending, 0, ijCat([]byte{1}, ijUv(4), []byte("abc"))), want: "exceeds"},
		{name: "begin negative attempts", give: ijBeginPayload("k", ijNoHeader, journalStatePending, -1, ijNoBody), want: "negative attempts"},
		{name: "finish negative attempts", give: ijFinishPayload("k", journalStateDone, math.MinInt64, ijEpoch), want: "negative attempts"},
		{name: "begin empty key", give: ijBeginPayload("", ijNoHeader, journalStatePending, 0, ijNoBody), want: "bad key"},
		{name: "finish key with a newline", give: ijFinishPayload("k\n", journalStateDone, 0, ijEpoch), want: "bad key"},
		{name: "delete key too long", give: ijCat([]byte{kindDelete}, ijStr(tooLong)), want: "bad key"},
		{name: "delete key with a quote", give: ijCat([]byte{kindDelete}, ijStr(`a"b`)), want: "bad key"},
		{name: "clock without its time", give: []byte{kindClock}, want: "bad varint"},
		{name: "clock without nanoseconds", give: ijCat([]byte{kindClock}, ijV(1)), want: "bad varint"},
		{name: "clock trailing byte", give: ijCat([]byte{kindClock}, ijEpoch, []byte{0}), want: "1 trailing bytes"},
		{name: "clock with a key", give: ijCat([]byte{kindClock}, ijStr("k"), ijEpoch), want: "trailing"},
		{name: "clock nanoseconds out of range", give: ijCat([]byte{kindClock}, ijV(0), ijUv(uint64(time.Second))), want: "nanoseconds"},
		{name: "lowercase clock kind", give: ijCat([]byte{'t'}, ijEpoch), want: "unknown record kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeRecord(tt.give)
			assert.Nil(t, got)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

// Every proper prefix of a valid payload is refused: a record cut short
// never passes for a shorter one.
func TestJournalDecodeRecordRejectsTruncation(t *testing.T) {
	full, err := appendBegin(nil, ijSampleEntries()[1].give)
	require.NoError(t, err)
	tests := []struct {
		name string
		give []byte
	}{
		{name: "begin", give: full[recHdrLen:]},
		{name: "finish", give: appendFinish(nil, "k", journalStateDone, 201, 3, time.Unix(1e9, 1))[recHdrLen:]},
		{name: "delete", give: appendDelete(nil, "key")[recHdrLen:]},
		{name: "clock", give: appendClock(nil, time.Unix(1e9, 123_456_789))[recHdrLen:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeRecord(tt.give)
			require.NoError(t, err, "the whole payload is valid")
			for n := range len(tt.give) {
				got, err := decodeRecord(tt.give[:n])
				assert.Nil(t, got, "prefix of %d bytes", n)
				assert.ErrorIs(t, err, ErrCorrupt, "prefix of %d bytes", n)
			}
		})
	}
}

// ijFlip returns a copy of b with byte i inverted.
func ijFlip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0xff
	return c
}

// ijSalt is the salt of the files the tests build by hand.
const ijSalt = 0x5eed5a17c0ffee42

// ijBatch seals records as one batch numbered seq, as if written at
// offset 0 of a file salted with ijSalt: ijFile seals it again where it
// lands.
func ijBatch(seq uint64, records ...[]byte) []byte {
	b := ijCat(append([][]byte{make([]byte, batchHdrLen)}, records...)...)
	sealBatch(b, seq, 0, ijSalt)
	return b
}

// ijFile is a journal file: the file header, then the pieces given. A
// piece that is a valid batch (for offset 0, as ijBatch makes them) is
// sealed again for its offset in the file; anything else (a damaged or
// torn batch, garbage) is copied as it is.
func ijFile(pieces ...[]byte) []byte {
	out := fileHeader(ijSalt)
	for _, p := range pieces {
		off := len(out)
		out = append(out, p...)
		if seq, _, n, ok := readBatch(p, 0, ijSalt); ok && n == len(p) {
			sealBatch(out[off:], seq, int64(off), ijSalt)
		}
	}
	return out
}

// ijT0 is the time the byte-level replay tests stamp entries with.
var ijT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// ijEntry is a pending entry for key, as Begin would store it.
func ijEntry(key, operation string) *idemhttp.Entry {
	return &idemhttp.Entry{
		Operation: operation, Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":100}`),
		Fingerprint: "fp-" + key, Created: ijT0, Updated: ijT0, State: idemhttp.StatePending,
	}
}

// ijBegin is the framed begin record of e.
func ijBegin(t testing.TB, e *idemhttp.Entry) []byte {
	t.Helper()
	b, err := appendBegin(nil, e)
	require.NoError(t, err)
	return b
}

// ijOutcome is what finish records set on an index entry.
type ijOutcome struct {
	state      byte
	lastStatus int
	attempts   int
	updated    time.Time
}

func ijOutcomeOf(le *entry) ijOutcome {
	return ijOutcome{state: le.state, lastStatus: le.lastStatus, attempts: le.attempts, updated: le.updated()}
}

// ijKeys returns the index's keys, sorted.
func ijKeys(idx *index) []string {
	keys := make([]string, 0, idx.byKey.len())
	for k := range ijMap(idx.byKey) {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Replay builds the index from the records: what a finish sets, what a
// delete frees, where each entry's begin record is. How the records are
// read from the file (batches, damage, torn tails) is internal/wal's and
// tested there.
func TestJournalReplay(t *testing.T) {
	a, b, c := ijBegin(t, ijEntry("a", "op-a")), ijBegin(t, ijEntry("b", "op-b")), ijBegin(t, ijEntry("c", ""))
	t1 := ijT0.Add(time.Minute)
	b1 := ijBatch(1, a, b)
	b2 := ijBatch(2, appendFinish(nil, "a", journalStateDone, 201, 1, t1), appendDelete(nil, "b"))
	b3 := ijBatch(3, c)
	file := ijFile(b1, b2, b3)

	idx, err := replay(file, false)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "c"}, ijKeys(idx.index))
	assert.Equal(t, map[string]*entry{"op-a": idx.byKey.get("a")}, ijMap(idx.byOp), "a deleted entry frees its operation")
	assert.Equal(t, int64(len(a)+len(c)+2*entryOverhead), idx.live)

	wantA := newFjEntry("a", "op-a", ijT0, t1, 1, 201, journalStateDone, fileHdrLen+batchHdrLen, len(a))
	assert.Equal(t, wantA, idx.byKey.get("a"))
	wantC := newFjEntry("c", "", ijT0, ijT0, 0, 0, journalStatePending, int64(fileHdrLen+len(b1)+len(b2)+batchHdrLen), len(c))
	assert.Equal(t, wantC, idx.byKey.get("c"))

	empty, err := replay(fileHeader(ijSalt), false)
	require.NoError(t, err)
	assert.Zero(t, empty.byKey.len())
	assert.Zero(t, empty.byOp.len())
	assert.Empty(t, empty.all)
	assert.Zero(t, empty.live)
}

// Finish records hold totals, not deltas: compaction folds a finish into
// the begin record it writes, and the same finish may then be replayed
// after it.
func TestJournalReplayFinishIsAbsolute(t *testing.T) {
	t1 := ijT0.Add(time.Minute)
	begin := ijBegin(t, ijEntry("a", ""))
	finish := appendFinish(nil, "a", journalStateDone, 201, 3, t1)
	folded := ijEntry("a", "")
	folded.State, folded.LastStatus, folded.Attempts, folded.Updated = idemhttp.StateDone, 201, 3, t1
	tests := []struct {
		name string
		give []byte
	}{
		{name: "once", give: ijFile(ijBatch(1, begin, finish))},
		{name: "twice in one batch", give: ijFile(ijBatch(1, begin, finish, finish))},
		{name: "twice in two batches", give: ijFile(ijBatch(1, begin, finish), ijBatch(2, finish))},
		{name: "folded into a compacted begin, then replayed", give: ijFile(ijBatch(41, ijBegin(t, folded)), ijBatch(42, finish))},
	}
	want := ijOutcome{state: journalStateDone, lastStatus: 201, attempts: 3, updated: t1}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, err := replay(tt.give, false)
			require.NoError(t, err)
			require.NotNil(t, idx.byKey.get("a"))
			assert.Equal(t, want, ijOutcomeOf(idx.byKey.get("a")))
		})
	}
}

// A record that contradicts the index (or does not decode) was written
// that way: corruption, refused; SkipVerify (salvage) skips that record
// and goes on. Damage to the bytes themselves is internal/wal's
// (TestReplayRefusesDamage).
func TestJournalReplayRefusesBadRecords(t *testing.T) {
	a, c := ijBegin(t, ijEntry("a", "op")), ijBegin(t, ijEntry("c", ""))
	aAgain := ijBegin(t, &idemhttp.Entry{Key: "a", State: idemhttp.StateDone, Created: ijT0})
	sameOp := ijBegin(t, ijEntry("b", "op"))
	finishZ := appendFinish(nil, "z", journalStateDone, 200, 1, ijT0)
	deleteZ := appendDelete(nil, "z")
	undecodable := appendRecord(nil, []byte{'X', 1, 'z'})
	tests := []struct {
		name     string
		give     []byte
		wantErr  string
		wantKeys []string // after salvage
	}{
		{name: "begin of a stored key", give: ijFile(ijBatch(1, a), ijBatch(2, aAgain, c)), wantErr: `key "a" stored twice`, wantKeys: []string{"a", "c"}},
		{name: "begin of a stored operation", give: ijFile(ijBatch(1, a, sameOp, c)), wantErr: `operation "op" stored twice`, wantKeys: []string{"a", "c"}},
		{name: "finish of an unknown key", give: ijFile(ijBatch(1, a, finishZ, c)), wantErr: `outcome of unknown key "z"`, wantKeys: []string{"a", "c"}},
		{name: "delete of an unknown key", give: ijFile(ijBatch(1, a), ijBatch(2, deleteZ, c)), wantErr: `deletion of unknown key "z"`, wantKeys: []string{"a", "c"}},
		{name: "record that does not decode", give: ijFile(ijBatch(1, a, undecodable, c)), wantErr: "unknown record kind", wantKeys: []string{"a", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, err := replay(tt.give, false)
			assert.Nil(t, idx)
			assert.ErrorIs(t, err, ErrCorrupt)
			assert.ErrorContains(t, err, tt.wantErr)

			idx, err = replay(tt.give, true)
			require.NoError(t, err, "salvage skips the record")
			assert.Equal(t, tt.wantKeys, ijKeys(idx.index))
			assert.Zero(t, idx.Skipped, "no batch is skipped")
		})
	}
}

// ijSeedPayloads are record payloads that seed FuzzDecodeRecord.
func ijSeedPayloads(t testing.TB) [][]byte {
	var out [][]byte
	for _, tt := range ijSampleEntries() {
		out = append(out, ijBegin(t, tt.give)[recHdrLen:])
	}
	return append(out,
		appendFinish(nil, "k", journalStateDone, 201, 2, ijT0)[recHdrLen:],
		appendFinish(nil, "k", journalStateAbandoned, -1, 0, time.Time{})[recHdrLen:],
		appendDelete(nil, "k")[recHdrLen:],
		appendClock(nil, ijT0)[recHdrLen:],
		ijCat([]byte{kindClock}, ijEpoch, []byte{0}),
		appendWitness(nil, &clockState{at: ijT0, boot: bootOf("b"), up: time.Hour, off: 2 * time.Hour, doubt: ijT0.Add(-time.Minute)})[recHdrLen:],
		appendWitness(nil, &clockState{at: ijT0, up: -time.Hour})[recHdrLen:],
		ijBeginPayload("k", ijHeader("A", "B"), journalStateDone, 2, ijCat([]byte{1}, ijStr("abc"))),
		ijBeginPayload("k", ijHeader("B", "A"), journalStatePending, 0, ijNoBody),
		ijBegin(t, ijParkedOf(ijEntry("k", "op-k")))[recHdrLen:],
		ijCat(ijBeginPayload("k", ijHeader("A", "B"), journalStateDone, 2, ijNoBody), ijEpoch), // parked, but done
		[]byte{'X'},
	)
}

// ijParkedOf returns e pending with a not-before, for a parked record.
func ijParkedOf(e *idemhttp.Entry) *idemhttp.Entry {
	r := *e
	r.State, r.LastStatus, r.Attempts = idemhttp.StatePending, 429, 1
	r.NotBefore = ijT0.Add(time.Hour)
	return &r
}

// FuzzDecodeRecord checks that no payload makes the decoder panic or
// over-allocate, that every rejection wraps ErrCorrupt, and that
// whatever it accepts survives being encoded and decoded again unchanged.
func FuzzDecodeRecord(f *testing.F) {
	for _, p := range ijSeedPayloads(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		rec, err := decodeRecord(payload)
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			require.Nil(t, rec)
			return
		}
		var again []byte
		switch rec.kind {
		case kindBegin, kindResult, kindParked:
			again, err = appendBegin(nil, rec.entry())
			require.NoError(t, err)
		case kindFinish:
			again = appendFinish(nil, rec.key, rec.state, rec.lastStatus, rec.attempts, rec.updated)
		case kindDelete:
			again = appendDelete(nil, rec.key)
		case kindClock:
			again = appendClock(nil, rec.updated)
		case kindWitness:
			again = appendWitness(nil, rec.clk)
		default:
			t.Fatalf("decoded a record of unknown kind %q", rec.kind)
		}
		require.Equal(t, rec, ijDecodeFramed(t, again))
	})
}

// ijResultOf returns e done with a result, for a result record.
func ijResultOf(e *idemhttp.Entry) *idemhttp.Entry {
	r := *e
	r.State, r.LastStatus = idemhttp.StateDone, 201
	r.Result = &idemhttp.Result{Status: 201, Body: []byte(`{"id":"x"}`)}
	return &r
}

// ijSeedFiles are journal files that seed FuzzJournalIndex. The same
// files, as a corpus, seed internal/wal's FuzzReplay.
func ijSeedFiles(t testing.TB) [][]byte {
	a, b, c := ijBegin(t, ijEntry("a", "op-a")), ijBegin(t, ijEntry("b", "op-b")), ijBegin(t, ijEntry("c", ""))
	finishA := appendFinish(nil, "a", journalStateDone, 201, 1, ijT0.Add(time.Second))
	b1, b2, b3 := ijBatch(1, a, b), ijBatch(2, finishA, appendDelete(nil, "b")), ijBatch(3, c)
	return [][]byte{
		ijFile(),
		ijFile(b1),
		ijFile(b1, b2, b3),
		ijFile(b1, ijBatch(2, finishA, finishA, ijBegin(t, ijSampleEntries()[1].give))),
		ijFile(b1, ijBatch(2, ijBegin(t, ijResultOf(ijEntry("a", "op-a"))))), // a result replacing a's begin record
		ijFile(b1, ijBatch(2, ijBegin(t, ijParkedOf(ijEntry("a", "op-a"))))), // a park replacing a's begin record
		ijFile(b1, ijFlip(b2, 25), b3),
		ijFile(b1, b2[:len(b2)-3]),
		ijFile(ijBatch(1, a), ijBatch(3, c)),
		ijFile(ijBatch(1, appendClock(nil, ijT0.Add(time.Hour)), a, b), b2),
	}
}

// FuzzJournalIndex checks that the index replay builds points at begin
// records inside the valid part of the file, that opening (which does not
// decode requests) and Verify (which does) accept the same files and build
// the same index, and that a refusal wraps ErrCorrupt. The fuzzer
// cannot forge CRCs, so each input is also replayed with the CRCs of its
// batches and records recomputed. internal/wal's FuzzReplay checks the
// bytes; this checks what the journal makes of them.
func FuzzJournalIndex(f *testing.F) {
	for _, file := range ijSeedFiles(f) {
		f.Add(file[fileHdrLen:])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file := ijCat(fileHeader(ijSalt), data)
		for _, salvage := range []bool{false, true} {
			ijCheckReplay(t, file, salvage)
			ijCheckReplay(t, ijReseal(file), salvage)
		}
	})
}

// ijReseal returns a copy of file with the CRC of every batch that starts
// with the batch magic and fits in the file recomputed, and the CRCs of
// the records in it that fit.
func ijReseal(file []byte) []byte {
	b := bytes.Clone(file)
	for off := fileHdrLen; off+batchHdrLen <= len(b); {
		size := int(binary.LittleEndian.Uint32(b[off+4:]))
		if binary.LittleEndian.Uint32(b[off:]) != magic(ijSalt) || size == 0 || size > len(b)-off-batchHdrLen {
			off++
			continue
		}
		batch := b[off : off+batchHdrLen+size]
		records := batch[batchHdrLen:]
		for p := 0; p+recHdrLen <= len(records); {
			n := int(binary.LittleEndian.Uint32(records[p:]))
			if n == 0 || n > len(records)-p-recHdrLen {
				break
			}
			finishRecord(records[p : p+recHdrLen+n])
			p += recHdrLen + n
		}
		sealBatch(batch, binary.LittleEndian.Uint64(batch[8:]), int64(off), ijSalt)
		off += len(batch)
	}
	return b
}

// ijCheckReplay replays file and checks the index's invariants.
func ijCheckReplay(t *testing.T, file []byte, salvage bool) {
	idx, err := replay(file, salvage)
	// With the read-ahead, which digests begin records on its own
	// goroutine, on a file of any size: the same outcome.
	restore := wal.SetReadAheadWindow(64)
	ahead, aheadErr := replay(file, salvage)
	restore()
	require.Equal(t, fmt.Sprint(err), fmt.Sprint(aheadErr), "without and with the read-ahead")
	if err == nil {
		require.Equal(t, idx.Replayed, ahead.Replayed)
		require.Equal(t, ijMap(idx.byKey), ijMap(ahead.byKey))
		require.Equal(t, idx.live, ahead.live)
		require.Equal(t, idx.high, ahead.high)
	}
	// Opening indexes begin records without decoding their requests;
	// Verify decodes everything. Both must accept the same files and
	// build the same index.
	full, fullErr := replayWith(file, salvage, (*index).verifyRecord)
	require.Equal(t, fullErr == nil, err == nil, "fast: %v, full: %v", err, fullErr)
	if err == nil {
		require.Equal(t, full.Replayed, idx.Replayed)
		require.Equal(t, full.byKey.len(), idx.byKey.len())
		for k, le := range ijMap(full.byKey) {
			got := idx.byKey.get(k)
			require.NotNil(t, got, k)
			require.Equal(t, ijIndexView(le), ijIndexView(got), k)
		}
		require.Equal(t, full.live, idx.live)
		require.Equal(t, full.high, idx.high, "the high-water mark")
	}
	if err != nil {
		require.False(t, salvage, "salvage never refuses: %v", err)
		require.ErrorIs(t, err, ErrCorrupt)
		require.Nil(t, idx)
		return
	}
	require.GreaterOrEqual(t, idx.End, int64(fileHdrLen))
	require.LessOrEqual(t, idx.End, int64(len(file)))
	require.Equal(t, int64(len(file))-idx.End, idx.Truncated, "everything after end is cut off")
	require.LessOrEqual(t, idx.Skipped, idx.End-fileHdrLen)
	if !salvage {
		require.Zero(t, idx.Skipped)
	}
	var live int64
	for key, le := range ijMap(idx.byKey) {
		require.Equal(t, key, le.key())
		require.False(t, le.unsynced)
		require.GreaterOrEqual(t, le.off, int64(fileHdrLen+batchHdrLen), key)
		require.LessOrEqual(t, le.off+int64(le.size), idx.End, key)
		payload, n, ok := readRecord(file[le.off : le.off+int64(le.size)])
		require.True(t, ok, "record of %q at %d", key, le.off)
		require.Equal(t, int(le.size), n)
		rec, err := decodeRecord(payload)
		require.NoError(t, err)
		require.Contains(t, []byte{kindBegin, kindResult, kindParked}, rec.kind)
		require.Equal(t, key, rec.key)
		require.Equal(t, rec.operation, le.operation())
		require.Contains(t, []byte{journalStatePending, journalStateDone, journalStateAbandoned}, le.state)
		require.GreaterOrEqual(t, le.attempts, 0)
		if le.operation() != "" {
			require.Same(t, le, idx.byOp.get(le.operation()), "operation of %q", key)
		}
		live += int64(le.size) + entryOverhead
	}
	require.Equal(t, live, idx.live, "live bytes are the entries' records")
	for op, le := range ijMap(idx.byOp) {
		require.Same(t, le, idx.byKey.get(le.key()), "operation %q", op)
		require.Equal(t, op, le.operation())
	}
}

// ijOpen opens a new journal with fault as its commit hook, and returns
// it with its path. It is closed when the test ends.
func ijOpen(t *testing.T, fault func(string) error) (*Journal, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal")
	j, err := Open(path, nil)
	require.NoError(t, err)
	// Before any write: the committer reads fault only once a write has
	// woken it, which orders this store before its loads.
	j.fault = fault
	t.Cleanup(func() { _ = j.Close() })
	return j, path
}

// ijReopen opens the journal at path again, closed when the test ends.
func ijReopen(t *testing.T, path string) *Journal {
	t.Helper()
	j, err := Open(path, nil)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, j.Close()) })
	return j
}

// ijArmed returns a fault hook that fails the commit step name with
// err once armed.
func ijArmed(name string, err error) (hook func(string) error, arm func()) {
	var armed atomic.Bool
	return func(s string) error {
		if s == name && armed.Load() {
			return err
		}
		return nil
	}, func() { armed.Store(true) }
}

// A failed write or fdatasync leaves the file's tail unknown: the Begin
// in that batch fails, and so does every later write, until the journal
// is closed and opened again.
func TestJournalFaultStopsWrites(t *testing.T) {
	for _, give := range []string{"write", "sync"} {
		t.Run(give, func(t *testing.T) {
			injected := errors.New("injected " + give + " failure")
			hook, arm := ijArmed(give, injected)
			j, path := ijOpen(t, hook)
			ctx := context.Background()
			_, err := j.Begin(ctx, ijEntry("before", ""))
			require.NoError(t, err)

			arm()
			_, err = j.Begin(ctx, ijEntry("victim", "op-victim"))
			assert.ErrorIs(t, err, injected)
			_, err = j.Get(ctx, "victim")
			assert.ErrorIs(t, err, idemhttp.ErrNotFound, "a Begin that failed stores nothing")

			_, err = j.Begin(ctx, ijEntry("later", "op-victim"))
			assert.ErrorIs(t, err, injected, "begin")
			assert.ErrorIs(t, j.Finish(ctx, "before", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201}), injected, "finish")
			assert.ErrorIs(t, j.Delete(ctx, "before"), injected, "delete")
			_, err = j.Prune(ctx, time.Now().Add(time.Hour))
			assert.ErrorIs(t, err, injected, "prune")
			assert.ErrorIs(t, j.Sync(ctx), injected, "sync")
			assert.ErrorIs(t, j.Compact(ctx), injected, "compact")
			got, err := j.Get(ctx, "before")
			require.NoError(t, err, "reads go on")
			assert.Equal(t, idemhttp.StatePending, got.State)
			assert.ErrorIs(t, j.Close(), injected)
			assert.NoError(t, j.Close(), "Close is idempotent")

			j2 := ijReopen(t, path)
			_, err = j2.Get(ctx, "victim")
			assert.ErrorIs(t, err, idemhttp.ErrNotFound, "the failed Begin's entry stays gone")
			_, err = j2.Get(ctx, "before")
			assert.NoError(t, err)
			existing, err := j2.Begin(ctx, ijEntry("after", "op-victim"))
			assert.NoError(t, err, "the reopened journal takes writes")
			assert.Nil(t, existing, "the failed Begin's operation is free")
			assert.NoError(t, j2.Verify(ctx))
		})
	}
}

// ijWaitBatched waits until the batch being filled holds n begins. The
// batch is internal state with no event to wait on, so it polls, briefly.
func ijWaitBatched(t *testing.T, j *Journal, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		b := j.log.Pending()
		return b != nil && j.pend[b] != nil && len(j.pend[b].begins) == n
	}, 10*time.Second, time.Millisecond)
}

// ijHold is a fault hook that stops the first write until released, so
// that the writes after it pile up in one batch; later writes fail with
// err (nil: succeed).
type ijHold struct {
	entered, release chan struct{}
	releaseOnce      func()
	writes           atomic.Int32
	err              error
}

func ijNewHold(err error) *ijHold {
	h := &ijHold{entered: make(chan struct{}), release: make(chan struct{}), err: err}
	h.releaseOnce = sync.OnceFunc(func() { close(h.release) })
	return h
}

func (h *ijHold) hook(s string) error {
	if s != "write" {
		return nil
	}
	if h.writes.Add(1) == 1 {
		close(h.entered)
		<-h.release
		return nil
	}
	return h.err
}

// ijBeginAll begins keys concurrently and returns a channel of their
// results.
func ijBeginAll(j *Journal, keys []string) <-chan error {
	errs := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			_, err := j.Begin(context.Background(), ijEntry(k, "op-"+k))
			errs <- err
		}()
	}
	return errs
}

func ijKeyList(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

func TestJournalFaultFailsEveryBeginInTheBatch(t *testing.T) {
	injected := errors.New("injected write failure")
	h := ijNewHold(injected)
	j, _ := ijOpen(t, h.hook)
	t.Cleanup(h.releaseOnce) // runs before Close: a failed require must not leave the committer stuck
	first := ijBeginAll(j, []string{"first"})
	<-h.entered // the first batch is being written; the next one fills

	keys := ijKeyList("k", 8)
	errs := ijBeginAll(j, keys)
	ijWaitBatched(t, j, len(keys))
	h.releaseOnce()

	require.NoError(t, <-first)
	for range keys {
		assert.ErrorIs(t, <-errs, injected)
	}
	ctx := context.Background()
	for _, k := range keys {
		_, err := j.Get(ctx, k)
		assert.ErrorIs(t, err, idemhttp.ErrNotFound, k)
	}
	_, err := j.Get(ctx, "first")
	assert.NoError(t, err)
	assert.ErrorIs(t, j.Close(), injected)
}

// Finish is written behind: its failure surfaces at the next Sync (and at
// Close). The entry itself stays.
func TestJournalFaultFailsTheSyncAfterFinish(t *testing.T) {
	tests := []struct {
		give       string
		wantStates []idemhttp.State // after reopening
	}{
		{give: "write", wantStates: []idemhttp.State{idemhttp.StatePending}},
		// The record reached the page cache; whether it reached the disk
		// is unknown.
		{give: "sync", wantStates: []idemhttp.State{idemhttp.StatePending, idemhttp.StateDone}},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			injected := errors.New("injected " + tt.give + " failure")
			hook, arm := ijArmed(tt.give, injected)
			j, path := ijOpen(t, hook)
			ctx := context.Background()
			_, err := j.Begin(ctx, ijEntry("a", ""))
			require.NoError(t, err)

			arm()
			require.NoError(t, j.Finish(ctx, "a", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1}), "Finish does not wait for the disk")
			assert.ErrorIs(t, j.Sync(ctx), injected)
			assert.ErrorIs(t, j.Close(), injected)

			got, err := ijReopen(t, path).Get(ctx, "a")
			require.NoError(t, err)
			assert.Contains(t, tt.wantStates, got.State)
		})
	}
}

// Compaction, which takes the file exclusively, waits for a commit that
// is failing, and then refuses: no deadlock, and no rewrite of a file
// whose tail is unknown.
func TestJournalFaultRacingCompact(t *testing.T) {
	injected := errors.New("injected sync failure")
	entered, release := make(chan struct{}), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	var syncs atomic.Int32
	j, _ := ijOpen(t, func(s string) error {
		if s != "sync" || syncs.Add(1) == 1 {
			return nil
		}
		close(entered)
		<-release
		return injected
	})
	t.Cleanup(releaseOnce)
	ctx := context.Background()
	_, err := j.Begin(ctx, ijEntry("before", ""))
	require.NoError(t, err)

	begun := ijBeginAll(j, []string{"victim"})
	<-entered
	compacted := make(chan error, 1)
	go func() { compacted <- j.Compact(ctx) }()
	// Wait until Compact waits for the file: a waiting writer makes
	// TryRLock fail.
	require.Eventually(t, func() bool {
		return j.log.FileBusy()
	}, 10*time.Second, time.Millisecond)
	releaseOnce()

	for _, ch := range []<-chan error{begun, compacted} {
		select {
		case err := <-ch:
			assert.ErrorIs(t, err, injected)
		case <-time.After(10 * time.Second):
			t.Fatal("deadlock: Begin or Compact did not return")
		}
	}
	_, err = j.Get(ctx, "before")
	assert.NoError(t, err)
	assert.ErrorIs(t, j.Close(), injected)
}

// ijDurable reports whether key's entry is on disk: published in the
// index, inside the synced part of the file, and found by replaying what
// the file holds now.
func ijDurable(j *Journal, path, key string) error {
	j.mu.Lock()
	le := j.byKey.get(key)
	var published bool
	if le != nil {
		published = !le.unsynced && le.off+int64(le.size) <= j.durable
	}
	durable := j.durable
	j.mu.Unlock()
	if !published {
		return fmt.Errorf("%s: not published", key)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	// Only the durable prefix: past it another commit may be writing its
	// batch (and the zeros of a preallocated tail after it) while this
	// reads, and a read racing a write can see any mix of old and new
	// bytes there. What is acknowledged lies within the prefix.
	if int64(len(data)) > durable {
		data = data[:durable]
	}
	idx, err := replay(data, false)
	if err != nil {
		return err
	}
	if idx.byKey.get(key) == nil {
		return fmt.Errorf("%s: not in the file", key)
	}
	return nil
}

// ijCopyHolds opens a byte copy of the journal at path (a different file,
// so the original's lock does not stop it) and checks it holds keys.
func ijCopyHolds(t *testing.T, path string, keys []string) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	cp := path + ".copy"
	require.NoError(t, os.WriteFile(cp, data, 0o600))
	c := ijReopen(t, cp)
	ctx := context.Background()
	for _, k := range keys {
		_, err := c.Get(ctx, k)
		assert.NoError(t, err, k)
	}
}

// Begins that arrive while a commit runs share the next one, and each is
// on disk when it returns.
func TestJournalCommitGroupsBegins(t *testing.T) {
	h := ijNewHold(nil)
	j, path := ijOpen(t, h.hook)
	t.Cleanup(h.releaseOnce)
	first := ijBeginAll(j, []string{"first"})
	<-h.entered

	keys := ijKeyList("k", 16)
	durable := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			_, err := j.Begin(context.Background(), ijEntry(k, ""))
			if err == nil {
				err = ijDurable(j, path, k)
			}
			durable <- err
		}()
	}
	ijWaitBatched(t, j, len(keys))
	h.releaseOnce()

	require.NoError(t, <-first)
	for range keys {
		assert.NoError(t, <-durable)
	}
	st := j.Stats()
	assert.Equal(t, uint64(1+len(keys)), st.Writes)
	assert.Equal(t, uint64(2), st.Commits, "one commit for the first Begin, one for the rest")
	ijCopyHolds(t, path, append(keys, "first"))
}

// Under free-running load, group commit merges Begins, and none returns
// before its entry is on disk.
func TestJournalCommitBeginIsDurableOnReturn(t *testing.T) {
	j, path := ijOpen(t, nil)
	const workers, each = 16, 20
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, k := range ijKeyList(fmt.Sprintf("w%d", w), each) {
				_, err := j.Begin(context.Background(), ijEntry(k, ""))
				if err == nil {
					err = ijDurable(j, path, k)
				}
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	st := j.Stats()
	assert.Equal(t, uint64(workers*each), st.Writes)
	assert.Less(t, st.Commits, st.Writes, "concurrent Begins shared commits")
	ijCopyHolds(t, path, ijKeyList("w0", each))
}

// Regression: with one processor, the committer, made runnable by the
// first caller's kick, ran before the other callers and sealed each
// record alone: 64 concurrent Begins took 64 commits (seen in full runs of
// the package with -cpu 1; alone, the runtime often hands the processor
// to the callers during the committer's write, and the bug hides). It now
// yields once before sealing.
func TestJournalCommitGroupsWithOneProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	j, _ := ijOpen(t, nil)
	keys := ijKeyList("p", 64)
	start := make(chan struct{})
	errs := make(chan error, len(keys))
	for _, k := range keys {
		go func() {
			<-start // all runnable at once, as under load
			_, err := j.Begin(context.Background(), ijEntry(k, ""))
			errs <- err
		}()
	}
	close(start)
	for range keys {
		require.NoError(t, <-errs)
	}
	st := j.Stats()
	t.Logf("%d Begins in %d commits", st.Writes, st.Commits)
	assert.Less(t, st.Commits, st.Writes/4)
}

// A directory sync that fails after compaction's rename stops writes: the
// rename may not survive a power cut, and writes to the new file would be
// lost with it.
func TestJournalFaultDirSyncStopsWrites(t *testing.T) {
	if !wal.CanRewrite {
		t.Skip("no compaction on this platform")
	}
	injected := errors.New("injected directory sync failure")
	j, _ := ijOpen(t, func(s string) error {
		if s == "syncdir" {
			return injected
		}
		return nil
	})
	ctx := context.Background()
	_, err := j.Begin(ctx, ijEntry("k1", ""))
	require.NoError(t, err)
	assert.ErrorIs(t, j.Compact(ctx), injected)
	_, err = j.Begin(ctx, ijEntry("k2", ""))
	assert.ErrorIs(t, err, injected)
	_, err = j.Get(ctx, "k1")
	assert.NoError(t, err, "reads go on")
	assert.ErrorIs(t, j.Close(), injected)
}

// Compaction holds writers up only for its last step: while it rewrites
// the live entries, Begin, Finish, Get and Delete go on, and what they
// wrote meanwhile survives the switch to the new file. Checked to fail
// (deadlock, caught by the timeout) with the file held exclusively for
// the whole rewrite, as before.
func TestJournalCompactDoesNotHoldUpWriters(t *testing.T) {
	if !wal.CanRewrite {
		t.Skip("no compaction on this platform")
	}
	entered, release := make(chan struct{}), make(chan struct{})
	j, path := ijOpen(t, func(s string) error {
		if s == "catchup" {
			close(entered)
			<-release
		}
		return nil
	})
	ctx := context.Background()
	for _, k := range []string{"old-1", "old-2", "old-3"} {
		_, err := j.Begin(ctx, ijEntry(k, ""))
		require.NoError(t, err)
	}
	compacted := make(chan error, 1)
	go func() { compacted <- j.Compact(ctx) }()
	<-entered

	done := make(chan error, 1)
	go func() {
		_, err := j.Begin(ctx, ijEntry("during", "op-during"))
		if err == nil {
			err = j.Finish(ctx, "old-1", idemhttp.Outcome{State: idemhttp.StateDone, Status: 201, Attempts: 1, At: ijT0.Add(time.Hour)})
		}
		if err == nil {
			err = j.Delete(ctx, "old-2")
		}
		if err == nil {
			_, err = j.Get(ctx, "old-3")
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("Begin waited for the compaction")
	}
	close(release)
	require.NoError(t, <-compacted)
	_, err := j.Begin(ctx, ijEntry("after", ""))
	require.NoError(t, err)
	require.NoError(t, j.Verify(ctx))
	require.NoError(t, j.Close())

	r := ijReopen(t, path)
	got, err := r.Entries(ctx)
	require.NoError(t, err)
	var keys []string
	for _, e := range got {
		keys = append(keys, e.Key)
	}
	assert.ElementsMatch(t, []string{"old-1", "old-3", "during", "after"}, keys)
	e, err := r.Get(ctx, "old-1")
	require.NoError(t, err)
	assert.Equal(t, idemhttp.StateDone, e.State, "the outcome recorded during the rewrite")
	e, err = r.Lookup(ctx, "op-during")
	require.NoError(t, err)
	assert.Equal(t, "during", e.Key)
}

// Prune scans the entries a chunk at a time and drops the gone ones from
// the list it scans; entries begun during the scan are kept, and a
// delete in between is not lost.
func TestJournalPruneScansInChunks(t *testing.T) {
	j, path := ijOpen(t, nil)
	ctx := context.Background()
	const n = 3*removeChunk + 17
	keys := ijKeyList("k", n)
	errs := ijBeginAll(j, keys)
	for range keys {
		require.NoError(t, <-errs)
	}
	for i, k := range keys {
		if i%3 != 0 {
			require.NoError(t, j.Finish(ctx, k, idemhttp.Outcome{State: idemhttp.StateDone, Status: 200, At: ijT0}))
		}
	}
	require.NoError(t, j.Delete(ctx, keys[0]))
	pruned, err := j.Prune(ctx, ijT0.Add(time.Second))
	require.NoError(t, err)
	assert.Equal(t, n-(n+2)/3, pruned)
	j.mu.Lock()
	assert.Equal(t, j.byKey.len(), len(j.all), "the scanned list holds the live entries only")
	j.mu.Unlock()
	require.NoError(t, j.Verify(ctx))
	require.NoError(t, j.Close())
	r := ijReopen(t, path)
	es, err := r.Entries(ctx)
	require.NoError(t, err)
	assert.Len(t, es, (n+2)/3-1)
}

// ijIndexView is what the index keeps of an entry, for comparing two.
func ijIndexView(le *entry) entry {
	v := *le
	v.deleting, v.gone, v.unsynced = false, false, false
	return v
}

// TestFjEntrySize pins the index entry's size: a million of them are a
// journal's memory. 80 bytes is a malloc size class; one byte more takes
// 96.
func TestFjEntrySize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		assert.LessOrEqual(t, unsafe.Sizeof(entry{}), uintptr(80))
	}
}

// ijMap returns what t indexes, as a map.
func ijMap(t *table) map[string]*entry {
	m := make(map[string]*entry, t.len())
	for le := range t.all() {
		m[t.name(le)] = le
	}
	return m
}
