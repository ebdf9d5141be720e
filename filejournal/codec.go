package filejournal

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/wal"
)

// Record payloads: the Journal's records, in the log that
// internal/wal writes (docs/journal-format.md describes both). A payload
// starts with its kind byte.
const (
	kindBegin  = 'B'
	kindFinish = 'F'
	kindDelete = 'D'
	// kindClock holds one time: the journal's high-water mark (see
	// [Journal.HighWater]) when the file was compacted, so that the
	// mark outlives the records it was taken from.
	kindClock = 'T'
	// kindResult is a begin record of a done entry that keeps its
	// result (idemhttp.Policy.KeepResults), followed by the result: it
	// replaces the entry's earlier begin record when one is in the file,
	// and stands for it in a compacted one.
	kindResult = 'R'
	// kindWitness holds the journal's clock state (see Journal.Now): the
	// last reading of its clock with the machine's boot and uptime then,
	// the set-backs measured and the time up to which entries are of
	// unknown age. The last one in the file is the state.
	kindWitness = 'W'
	// kindParked is a begin record of a pending entry with a not-before
	// time (idemhttp.Entry.NotBefore: the server's Retry-After, when a
	// call parked the operation), followed by that time. Like a result
	// record it replaces the entry's earlier record when one is in the
	// file, and stands for it in a compacted one. An entry's not-before
	// is its parked record's while the entry's state, last status,
	// attempts and updated time are the record's own: a later finish
	// record (a resend's outcome) ends it.
	kindParked = 'P'

	recHdrLen = wal.RecordHeaderLen
	maxRecord = wal.MaxRecord
)

// State bytes. Stored as a byte, not the State string, so that an unknown
// byte is recognisably corrupt.
const (
	journalStatePending   = 1
	journalStateDone      = 2
	journalStateAbandoned = 3
)

// record is one decoded record. Strings own their memory; body aliases
// the decoder's input.
type record struct {
	kind        byte
	key         string
	operation   string
	method      string
	url         string
	fingerprint string
	header      http.Header
	created     time.Time
	updated     time.Time // and a clock record's time
	state       byte
	attempts    int
	lastStatus  int
	hasBody     bool
	body        []byte
	result      *idemhttp.Result // of a result record
	clk         *clockState      // of a witness record
	notBefore   time.Time        // of a parked record
}

// entry returns the Entry a begin record describes, with its own copy of
// the body.
func (r *record) entry() *idemhttp.Entry {
	e := &idemhttp.Entry{
		Operation: r.operation, Key: r.key, Method: r.method, URL: r.url,
		Header: r.header, Fingerprint: r.fingerprint, Created: r.created, Updated: r.updated,
		Attempts: r.attempts, LastStatus: r.lastStatus, State: journalStateOf(r.state),
		NotBefore: r.notBefore,
	}
	if r.hasBody {
		e.Body = append(make([]byte, 0, len(r.body)), r.body...)
	}
	if r.result != nil {
		res := *r.result
		res.Body = append(make([]byte, 0, len(r.result.Body)), r.result.Body...)
		e.Result = &res
	}
	return e
}

// beginSize returns an upper bound of the encoded begin payload of e,
// and the header names it stores, sorted.
func beginSize(e *idemhttp.Entry) (int, []string) {
	names := make([]string, 0, len(e.Header))
	// Fixed fields at their widest: the kind, five string lengths, the
	// header count, two times, the state, attempts, last status, the body
	// flag and length (varints take at most 10 bytes).
	n := 1 + 5*10 + 10 + 2*20 + 1 + 2*10 + 1 + 10
	n += len(e.Key) + len(e.Operation) + len(e.Method) + len(e.URL) + len(e.Fingerprint) + len(e.Body)
	n += 20 // a parked record's not-before
	for name, vals := range e.Header {
		if len(vals) > 0 {
			names = append(names, name)
			n += len(name) + 2*10 // its length and its value count
			for _, v := range vals {
				n += len(v) + 10
			}
		}
	}
	slices.Sort(names)
	if r := e.Result; r != nil {
		n += 10 + 10 + 10 + len(r.Body) // status, header count, body length
		for name, vals := range r.Header {
			n += len(name) + 2*10
			for _, v := range vals {
				n += len(v) + 10
			}
		}
	}
	return n, names
}

// appendHeader appends a header: a uvarint name count, then per name, in
// sorted order, the name, a uvarint value count and the values. Names
// without values are dropped.
func appendHeader(dst []byte, h http.Header, names []string) []byte {
	if names == nil {
		for name, vals := range h {
			if len(vals) > 0 {
				names = append(names, name)
			}
		}
		slices.Sort(names)
	}
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		dst = journalAppendString(dst, name)
		vals := h[name]
		dst = binary.AppendUvarint(dst, uint64(len(vals)))
		for _, v := range vals {
			dst = journalAppendString(dst, v)
		}
	}
	return dst
}

// appendBegin appends the framed begin record of e (sanitised, with a
// known state) to dst: a result record when e is done and keeps its
// Result, a parked record when e is pending with a NotBefore (which
// other states do not keep). Header names without values carry no
// information and are dropped.
func appendBegin(dst []byte, e *idemhttp.Entry) ([]byte, error) {
	size, names := beginSize(e)
	return appendBeginSized(dst, e, size, names)
}

// appendBeginSized is appendBegin for a caller that has computed
// beginSize(e) already: size and names are what it returned.
func appendBeginSized(dst []byte, e *idemhttp.Entry, size int, names []string) ([]byte, error) {
	st, ok := journalStateByte(e.State)
	if !ok {
		return dst, fmt.Errorf("entry %q: unknown state %q", e.Key, e.State)
	}
	kind := byte(kindBegin)
	if e.Result != nil {
		if st != journalStateDone {
			return dst, fmt.Errorf("entry %q: a result with state %q", e.Key, e.State)
		}
		kind = kindResult
	}
	parked := st == journalStatePending && !e.NotBefore.IsZero()
	if parked {
		kind = kindParked
	}
	if size > maxRecord+beginSlack {
		// Certainly too large: refuse before copying the body.
		return dst, tooLarge(e, size)
	}
	start := len(dst)
	dst = slices.Grow(dst, recHdrLen+size)
	dst = append(dst, make([]byte, recHdrLen)...) // length and CRC, filled in below
	dst = append(dst, kind)
	dst = journalAppendString(dst, e.Key)
	dst = journalAppendString(dst, e.Operation)
	dst = journalAppendString(dst, e.Method)
	dst = journalAppendString(dst, e.URL)
	dst = journalAppendString(dst, e.Fingerprint)
	dst = appendHeader(dst, e.Header, names)
	dst = journalAppendTime(dst, e.Created)
	dst = journalAppendTime(dst, e.Updated)
	dst = append(dst, st)
	dst = binary.AppendVarint(dst, int64(e.Attempts))
	dst = binary.AppendVarint(dst, int64(e.LastStatus))
	if e.Body == nil {
		dst = append(dst, 0)
	} else {
		dst = append(dst, 1)
		dst = binary.AppendUvarint(dst, uint64(len(e.Body)))
		dst = append(dst, e.Body...)
	}
	if r := e.Result; r != nil {
		dst = binary.AppendVarint(dst, int64(r.Status))
		dst = appendHeader(dst, r.Header, nil)
		dst = binary.AppendUvarint(dst, uint64(len(r.Body)))
		dst = append(dst, r.Body...)
	}
	if parked {
		dst = journalAppendTime(dst, e.NotBefore)
	}
	if n := len(dst) - start - recHdrLen; n > maxRecord {
		return dst[:start], tooLarge(e, n)
	}
	finishRecord(dst[start:])
	return dst, nil
}

// beginSlack is how much beginSize may overestimate a begin record by:
// every varint counted at its widest.
const beginSlack = 256

func tooLarge(e *idemhttp.Entry, size int) error {
	return fmt.Errorf("%w: entry %q of about %d bytes is too large for the journal (at most %d)", idemhttp.ErrInvalidRequest, e.Key, size, maxRecord)
}

func finishRecord(rec []byte) { wal.FinishRecord(rec) }

// finishMax and deleteMax bound the size of a finish and a delete
// record for key.
func finishMax(key string) int { return recHdrLen + 1 + 10 + len(key) + 1 + 2*10 + 20 }
func deleteMax(key string) int { return recHdrLen + 1 + 10 + len(key) }

// appendFinish appends a framed finish record to dst.
func appendFinish(dst []byte, key string, state byte, status, attempts int, updated time.Time) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHdrLen)...)
	dst = append(dst, kindFinish)
	dst = journalAppendString(dst, key)
	dst = append(dst, state)
	dst = binary.AppendVarint(dst, int64(status))
	dst = binary.AppendVarint(dst, int64(attempts))
	dst = journalAppendTime(dst, updated)
	finishRecord(dst[start:])
	return dst
}

// clockMax bounds the size of a clock record.
const clockMax = recHdrLen + 1 + 20

// appendClock appends a framed clock record holding t to dst.
func appendClock(dst []byte, t time.Time) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHdrLen)...)
	dst = append(dst, kindClock)
	dst = journalAppendTime(dst, t)
	finishRecord(dst[start:])
	return dst
}

// appendDelete appends a framed delete record to dst.
func appendDelete(dst []byte, key string) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, recHdrLen)...)
	dst = append(dst, kindDelete)
	dst = journalAppendString(dst, key)
	finishRecord(dst[start:])
	return dst
}

// decodeRecord parses a record's payload. Any malformed input gives an
// error wrapping [ErrCorrupt]; it never panics, and allocates no
// more than the payload's length whatever it claims.
func decodeRecord(p []byte) (*record, error) {
	r := journalReader{b: p}
	rec := &record{kind: r.byte()}
	switch rec.kind {
	case kindBegin, kindResult, kindParked:
		rec.key = r.str()
		rec.operation = r.str()
		rec.method = r.str()
		rec.url = r.str()
		rec.fingerprint = r.str()
		rec.header = r.header()
		rec.created = r.time()
		rec.updated = r.time()
		rec.state = r.state()
		rec.attempts = r.int()
		rec.lastStatus = r.int()
		switch r.byte() {
		case 0:
		case 1:
			rec.hasBody = true
			rec.body = r.bytes()
		default:
			r.fail("bad body flag")
		}
		if rec.kind == kindResult {
			res := &idemhttp.Result{Status: r.int(), Header: r.header(), Body: r.bytes()}
			if r.err == nil && rec.state != journalStateDone {
				r.fail("a result of an entry that is not done")
			}
			rec.result = res
		}
		if rec.kind == kindParked {
			rec.notBefore = r.time()
			if r.err == nil && (rec.state != journalStatePending || rec.notBefore.IsZero()) {
				r.fail("a parked record of an entry that is not pending, or without a time")
			}
		}
	case kindFinish:
		rec.key = r.str()
		rec.state = r.state()
		rec.lastStatus = r.int()
		rec.attempts = r.int()
		rec.updated = r.time()
	case kindDelete:
		rec.key = r.str()
	case kindClock:
		rec.updated = r.time()
	case kindWitness:
		rec.clk = r.witness()
	default:
		r.fail("unknown record kind %d", rec.kind)
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	if rec.attempts < 0 {
		return nil, fmt.Errorf("%w: negative attempts %d", ErrCorrupt, rec.attempts)
	}
	if rec.kind == kindClock || rec.kind == kindWitness {
		return rec, nil // the kinds without a key
	}
	if err := contract.ValidateKey(rec.key); err != nil {
		return nil, fmt.Errorf("%w: record with a bad key", ErrCorrupt)
	}
	return rec, nil
}

func journalAppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func journalAppendTime(b []byte, t time.Time) []byte {
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func journalStateByte(s idemhttp.State) (byte, bool) {
	switch s {
	case idemhttp.StatePending:
		return journalStatePending, true
	case idemhttp.StateDone:
		return journalStateDone, true
	case idemhttp.StateAbandoned:
		return journalStateAbandoned, true
	}
	return 0, false
}

// journalStateOf maps a state byte that decoding accepted to its State.
func journalStateOf(c byte) idemhttp.State {
	switch c {
	case journalStateDone:
		return idemhttp.StateDone
	case journalStateAbandoned:
		return idemhttp.StateAbandoned
	}
	return idemhttp.StatePending
}

// journalReader consumes a record front to back. The first problem is
// kept in err and turns every later read into a no-op returning zero
// values, so the parser reads straight through and checks once.
type journalReader struct {
	b   []byte
	err error
}

func (r *journalReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	r.b = nil
}

func (r *journalReader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail("record truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *journalReader) state() byte {
	c := r.byte()
	if r.err == nil && (c < journalStatePending || c > journalStateAbandoned) {
		r.fail("unknown state byte %d", c)
	}
	return c
}

func (r *journalReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) > 0 && r.b[0] < 0x80 {
		// One byte: nearly every length and count. Replay reads a
		// dozen per begin record, a million records at a time.
		v := uint64(r.b[0])
		r.b = r.b[1:]
		return v
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *journalReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// int reads a varint that must fit an int on this platform.
func (r *journalReader) int() int {
	v := r.varint()
	if int64(int(v)) != v {
		r.fail("integer %d out of range", v)
		return 0
	}
	return int(v)
}

// count reads an element count. Every element takes at least one byte, so a
// count beyond the bytes left is corrupt; checking it here bounds every
// allocation by the record's length.
func (r *journalReader) count() int {
	v := r.uvarint()
	if v > uint64(len(r.b)) {
		r.fail("count %d exceeds the %d bytes left", v, len(r.b))
		return 0
	}
	return int(v)
}

// bytes returns a length-prefixed field, aliasing the record.
func (r *journalReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail("field of %d bytes exceeds the %d bytes left", n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *journalReader) str() string { return string(r.bytes()) }

func (r *journalReader) time() time.Time {
	sec, nsec := r.timeParts()
	if r.err != nil {
		return time.Time{}
	}
	return unixTime(sec, nsec)
}

// timeParts reads a time as the file stores it, seconds and nanoseconds,
// without making a time.Time of it.
func (r *journalReader) timeParts() (int64, uint32) {
	sec := r.varint()
	nsec := r.uvarint()
	if nsec >= uint64(time.Second) {
		r.fail("nanoseconds %d out of range", nsec)
		return 0, 0
	}
	return sec, uint32(nsec)
}

// unixTime is the time the file stores as sec and nsec (< 1e9): UTC, or
// the zero Time.
func unixTime(sec int64, nsec uint32) time.Time {
	if sec == (time.Time{}).Unix() && nsec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// splitTime is t as the file stores it: see journalAppendTime.
func splitTime(t time.Time) (int64, uint32) {
	return t.Unix(), uint32(t.Nanosecond())
}

// header reads a header as appendHeader writes it: names in strictly
// increasing order, each with at least one value. nil for none.
func (r *journalReader) header() http.Header {
	names := r.count()
	if names == 0 || r.err != nil {
		return nil
	}
	h := make(http.Header, names)
	prev := ""
	for i := range names {
		name := r.str()
		vals := make([]string, r.count())
		for i := range vals {
			vals[i] = r.str()
		}
		if r.err != nil {
			break
		}
		if (i > 0 && name <= prev) || len(vals) == 0 {
			r.fail("header %q out of order, repeated or empty", name)
			break
		}
		prev = name
		h[name] = vals
	}
	return h
}
