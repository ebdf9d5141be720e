package idemhttp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// journalVersion is the file format: the first byte of every stored
// record, and the value of the file's version record (journalMetaBucket).
// A decoder that meets a version it does not know refuses the record
// instead of guessing, so a newer build's journal is never misread by an
// older one, nor an older build's by a newer one.
//
// Version 1 stored each entry whole under its key. Version 2 splits it in
// two records keyed by a sequence number: the request (method, URL,
// headers, body), written once, and the entry's state, which Finish
// rewrites. See filejournal_buckets.go.
const journalVersion = 2

// Record kinds: the byte after the version, so that a record found in the
// wrong bucket is recognisably corrupt.
const (
	journalKindState   = 's'
	journalKindRequest = 'r'
)

// journalCRCLen is the length of the CRC-32C trailer that seals a record.
const journalCRCLen = 4

// journalCRC is the Castagnoli table: hardware-accelerated on amd64 and
// arm64, and the polynomial storage systems use to catch torn or flipped
// bytes. bbolt checksums only its meta pages, so without this a flipped
// byte in a data page would decode into a plausible but wrong entry (a
// different key, a different body) and be resent.
var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// State bytes. Stored as a byte, not the State string, so that an unknown
// byte is recognisably corrupt.
const (
	journalStatePending   = 1
	journalStateDone      = 2
	journalStateAbandoned = 3
)

// journalEncodeEntry serialises e as its two version 2 records.
//
// The state record, small, rewritten by every Finish:
//
//	version byte, kind byte 's'
//	key, operation, fingerprint                (uvarint length, bytes)
//	state byte                                 } the tail that Finish
//	created, updated                           } rewrites: varint unix
//	attempts, last status                      } seconds, uvarint nanos; varints
//	CRC-32C (Castagnoli) of everything above, little endian
//
// The request record, written once by Begin:
//
//	version byte, kind byte 'r'
//	key, method, url                           (uvarint length, bytes)
//	header: uvarint name count, then per name (sorted): name, uvarint value count, values
//	body: 0 (not stored) or 1 followed by the length-prefixed body
//	CRC-32C of everything above
//
// Both carry the key, so that a record read through a damaged index (a
// sequence number pointing at another entry's record) is caught.
//
// It stores e as given: stripping secrets is the caller's job
// (journalSanitize), so that the codec stays a pure function for fuzzing.
// Header names with no values carry no information and are dropped.
func journalEncodeEntry(e *Entry) (state, request []byte, err error) {
	st, ok := journalStateByte(e.State)
	if !ok {
		return nil, nil, fmt.Errorf("entry %q: unknown state %q", e.Key, e.State)
	}
	state = journalAppendStateHead(nil, e.Key, e.Operation, e.Fingerprint)
	state = journalAppendStateTail(state, st, e.Created, e.Updated, e.Attempts, e.LastStatus)
	return state, journalEncodeRequest(e), nil
}

// journalAppendStateHead appends the part of a state record that never
// changes. The buffer it allocates has room for the rest.
func journalAppendStateHead(b []byte, key, operation, fingerprint string) []byte {
	if b == nil {
		b = make([]byte, 0, 2+3*binary.MaxVarintLen64+len(key)+len(operation)+len(fingerprint)+journalStateTailMax+journalCRCLen)
	}
	b = append(b, journalVersion, journalKindState)
	b = journalAppendString(b, key)
	b = journalAppendString(b, operation)
	return journalAppendString(b, fingerprint)
}

// journalStateTailMax bounds the length of a state record's tail.
const journalStateTailMax = 1 + 2*(binary.MaxVarintLen64+binary.MaxVarintLen32) + 2*binary.MaxVarintLen64

// journalAppendStateTail appends the part of a state record that Finish
// rewrites, and seals the record with its CRC.
func journalAppendStateTail(b []byte, state byte, created, updated time.Time, attempts, lastStatus int) []byte {
	b = append(b, state)
	b = journalAppendTime(b, created)
	b = journalAppendTime(b, updated)
	b = binary.AppendVarint(b, int64(attempts))
	b = binary.AppendVarint(b, int64(lastStatus))
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, journalCRC))
}

// journalEncodeRequest serialises the request record of e.
func journalEncodeRequest(e *Entry) []byte {
	n := 2 + 4*binary.MaxVarintLen64 + len(e.Key) + len(e.Method) + len(e.URL) + len(e.Body) + journalCRCLen
	names := make([]string, 0, len(e.Header))
	for name, vals := range e.Header {
		if len(vals) > 0 {
			names = append(names, name)
			n += len(name) + 2*binary.MaxVarintLen64
			for _, v := range vals {
				n += len(v) + binary.MaxVarintLen64
			}
		}
	}
	slices.Sort(names)

	b := make([]byte, 0, n)
	b = append(b, journalVersion, journalKindRequest)
	b = journalAppendString(b, e.Key)
	b = journalAppendString(b, e.Method)
	b = journalAppendString(b, e.URL)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = journalAppendString(b, name)
		vals := e.Header[name]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = journalAppendString(b, v)
		}
	}
	if e.Body == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(e.Body)))
		b = append(b, e.Body...)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, journalCRC))
}

// journalDecodeEntry parses the two records written by journalEncodeEntry
// and checks that they belong together. Any malformed input (short, a bad
// checksum, an unknown version, kind or state, a length running past the
// end, trailing bytes, records of two different keys) gives an error
// wrapping [ErrJournalCorrupt]; it never panics and never allocates more
// than the inputs' length, whatever they claim. The entry owns its memory:
// it shares nothing with the inputs, which bbolt only lends for one
// transaction.
func journalDecodeEntry(state, request []byte) (*Entry, error) {
	s, err := journalDecodeState(state)
	if err != nil {
		return nil, err
	}
	e := s.entry()
	if err := journalDecodeRequest(request, e); err != nil {
		return nil, fmt.Errorf("request: %w", err)
	}
	return e, nil
}

// journalState is a decoded state record. Its byte slices alias the
// record, so it is valid only as long as the record is: within the
// transaction that read it.
type journalState struct {
	key, operation, fingerprint []byte
	state                       State
	created, updated            time.Time
	attempts, lastStatus        int

	// head is the record's prefix up to the state byte: what Finish
	// copies unchanged into the rewritten record.
	head []byte
}

// entry returns the fields of s as an Entry that owns its memory.
func (s *journalState) entry() *Entry {
	return &Entry{
		Key:         string(s.key),
		Operation:   string(s.operation),
		Fingerprint: string(s.fingerprint),
		State:       s.state,
		Created:     s.created,
		Updated:     s.updated,
		Attempts:    s.attempts,
		LastStatus:  s.lastStatus,
	}
}

// journalUnseal checks a record's length, CRC, version and kind, and
// returns what lies between the kind byte and the CRC.
func journalUnseal(b []byte, kind byte) ([]byte, error) {
	if len(b) < 2+journalCRCLen {
		return nil, fmt.Errorf("%w: record of %d bytes is too short", ErrJournalCorrupt, len(b))
	}
	payload, sum := b[:len(b)-journalCRCLen], binary.LittleEndian.Uint32(b[len(b)-journalCRCLen:])
	if got := crc32.Checksum(payload, journalCRC); got != sum {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrJournalCorrupt, got, sum)
	}
	if payload[0] != journalVersion {
		return nil, fmt.Errorf("%w: record version %d, this build reads %d", ErrJournalCorrupt, payload[0], journalVersion)
	}
	if payload[1] != kind {
		return nil, fmt.Errorf("%w: record kind %q, want %q", ErrJournalCorrupt, payload[1], kind)
	}
	return payload[2:], nil
}

// journalDecodeState parses a state record without copying it.
func journalDecodeState(b []byte) (journalState, error) {
	fields, err := journalUnseal(b, journalKindState)
	if err != nil {
		return journalState{}, err
	}
	return journalParseState(fields, b)
}

// journalParseState parses the fields of a state record, between the kind
// byte and the CRC; record is the whole record, for head. It is separate
// from journalDecodeState so that the fuzzer, which cannot forge a CRC,
// reaches it directly.
func journalParseState(fields, record []byte) (journalState, error) {
	r := journalReader{b: fields}
	s := journalState{
		key:         r.bytes(),
		operation:   r.bytes(),
		fingerprint: r.bytes(),
	}
	s.head = record[:len(record)-len(r.b)-journalCRCLen]
	s.state = journalStateName(r.byte(), &r)
	s.created = r.time()
	s.updated = r.time()
	s.attempts = r.int()
	s.lastStatus = r.int()
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return journalState{}, r.err
	}
	if s.attempts < 0 {
		return journalState{}, fmt.Errorf("%w: negative attempts %d", ErrJournalCorrupt, s.attempts)
	}
	return s, nil
}

// journalDecodeRequest parses a request record into e's request fields,
// checking that it belongs to e.Key.
func journalDecodeRequest(b []byte, e *Entry) error {
	fields, err := journalUnseal(b, journalKindRequest)
	if err != nil {
		return err
	}
	return journalParseRequest(fields, e)
}

// journalParseRequest parses the fields of a request record, between the
// kind byte and the CRC. Like journalParseState, it is reached directly by
// the fuzzer.
func journalParseRequest(b []byte, e *Entry) error {
	r := journalReader{b: b}
	if key := r.bytes(); r.err == nil && string(key) != e.Key {
		return fmt.Errorf("%w: request of key %q stored for entry %q", ErrJournalCorrupt, key, e.Key)
	}
	method, url := r.str(), r.str()
	var header http.Header
	if names := r.count(); names > 0 {
		header = make(http.Header, names)
		for range names {
			name := r.str()
			vals := make([]string, r.count())
			for i := range vals {
				vals[i] = r.str()
			}
			if r.err != nil {
				break
			}
			if _, dup := header[name]; dup || len(vals) == 0 {
				r.fail("header %q repeated or empty", name)
				break
			}
			header[name] = vals
		}
	}
	var body []byte
	switch r.byte() {
	case 0:
	case 1:
		body = bytes.Clone(r.bytes())
		if body == nil {
			body = []byte{} // stored and empty, which is not "not stored"
		}
	default:
		r.fail("bad body flag")
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return r.err
	}
	e.Method, e.URL, e.Header, e.Body = method, url, header, body
	return nil
}

func journalAppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// journalAppendTime stores seconds and nanoseconds apart, because
// UnixNano cannot represent the zero Time or dates past 2262.
func journalAppendTime(b []byte, t time.Time) []byte {
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func journalStateByte(s State) (byte, bool) {
	switch s {
	case StatePending:
		return journalStatePending, true
	case StateDone:
		return journalStateDone, true
	case StateAbandoned:
		return journalStateAbandoned, true
	}
	return 0, false
}

func journalStateName(c byte, r *journalReader) State {
	switch c {
	case journalStatePending:
		return StatePending
	case journalStateDone:
		return StateDone
	case journalStateAbandoned:
		return StateAbandoned
	}
	r.fail("unknown state byte %d", c)
	return ""
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
		r.err = fmt.Errorf("%w: %s", ErrJournalCorrupt, fmt.Sprintf(format, args...))
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

func (r *journalReader) uvarint() uint64 {
	if r.err != nil {
		return 0
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
	sec := r.varint()
	nsec := r.uvarint()
	if nsec >= uint64(time.Second) {
		r.fail("nanoseconds %d out of range", nsec)
		return time.Time{}
	}
	if r.err != nil {
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// sanitize returns the copy of e that Begin encodes and stores. It may
// share memory with e, and must not be modified.
func (j *FileJournal) sanitize(e *Entry) (*Entry, error) {
	u, err := journalRedactURL(e.URL)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: journal begin %s: %w: %w", e.Key, ErrInvalidRequest, err)
	}
	rec := *e
	rec.URL = u
	rec.State = StatePending
	if rec.Created.IsZero() {
		rec.Created = time.Now()
	}
	if rec.Updated.IsZero() {
		rec.Updated = rec.Created
	}
	// rec is only encoded, never kept, so it may share e's header values;
	// a new map is needed only when there is something to leave out. The
	// encoder drops names without values.
	for name := range e.Header {
		if j.secret[http.CanonicalHeaderKey(name)] {
			rec.Header = make(http.Header, len(e.Header))
			for name, vals := range e.Header {
				if !j.secret[http.CanonicalHeaderKey(name)] {
					rec.Header[name] = vals
				}
			}
			break
		}
	}
	if j.omitBodies {
		rec.Body = nil
	}
	return &rec, nil
}

// journalRedactURL drops a password from a URL's userinfo. The client
// strips it already; this is the last line of defence. A URL that does not
// parse is refused rather than stored as given: its password could not be
// found, and it could not be resent anyway.
func journalRedactURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("URL does not parse") // not err: it quotes the URL, password and all
	}
	if u.User == nil {
		return raw, nil
	}
	if _, ok := u.User.Password(); !ok {
		return raw, nil
	}
	u.User = url.User(u.User.Username())
	return u.String(), nil
}
