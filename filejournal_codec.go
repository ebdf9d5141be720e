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

// journalVersion is the first byte of every stored entry. A decoder that
// meets a version it does not know refuses the record instead of guessing,
// so a newer build's journal is never misread by an older one.
const journalVersion = 1

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

// journalEncodeEntry serialises e as a version 1 record:
//
//	version byte
//	key, operation, method, url, fingerprint   (uvarint length, bytes)
//	state byte
//	created, updated                           (varint unix seconds, uvarint nanoseconds)
//	attempts, last status                      (varint)
//	header: uvarint name count, then per name (sorted): name, uvarint value count, values
//	body: 0 (not stored) or 1 followed by the length-prefixed body
//	CRC-32C (Castagnoli) of everything above, little endian
//
// It stores e as given: stripping secrets is the caller's job
// (journalSanitize), so that the codec stays a pure function for fuzzing.
// Header names with no values carry no information and are dropped.
func journalEncodeEntry(e *Entry) ([]byte, error) {
	state, ok := journalStateByte(e.State)
	if !ok {
		return nil, fmt.Errorf("entry %q: unknown state %q", e.Key, e.State)
	}
	n := 64 + len(e.Key) + len(e.Operation) + len(e.Method) + len(e.URL) + len(e.Fingerprint) + len(e.Body)
	for name, vals := range e.Header {
		n += len(name) + 2*binary.MaxVarintLen64
		for _, v := range vals {
			n += len(v) + binary.MaxVarintLen64
		}
	}
	b := make([]byte, 0, n)
	b = append(b, journalVersion)
	for _, s := range []string{e.Key, e.Operation, e.Method, e.URL, e.Fingerprint} {
		b = journalAppendString(b, s)
	}
	b = append(b, state)
	b = journalAppendTime(b, e.Created)
	b = journalAppendTime(b, e.Updated)
	b = binary.AppendVarint(b, int64(e.Attempts))
	b = binary.AppendVarint(b, int64(e.LastStatus))

	names := make([]string, 0, len(e.Header))
	for name, vals := range e.Header {
		if len(vals) > 0 {
			names = append(names, name)
		}
	}
	slices.Sort(names)
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
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, journalCRC)), nil
}

// journalDecodeEntry parses a record written by journalEncodeEntry. Any
// malformed input (short, a bad checksum, an unknown version or state, a
// length running past the end, trailing bytes) gives an error wrapping
// [ErrJournalCorrupt]; it never panics and never allocates more than the
// input's length, whatever the input claims. The entry owns its memory: it
// shares nothing with b, which bbolt only lends for one transaction.
func journalDecodeEntry(b []byte) (*Entry, error) {
	if len(b) < 1+journalCRCLen {
		return nil, fmt.Errorf("%w: record of %d bytes is too short", ErrJournalCorrupt, len(b))
	}
	payload, sum := b[:len(b)-journalCRCLen], binary.LittleEndian.Uint32(b[len(b)-journalCRCLen:])
	if got := crc32.Checksum(payload, journalCRC); got != sum {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrJournalCorrupt, got, sum)
	}
	if payload[0] != journalVersion {
		return nil, fmt.Errorf("%w: record version %d, this build reads %d", ErrJournalCorrupt, payload[0], journalVersion)
	}
	return journalParseEntry(payload[1:])
}

// journalParseEntry parses the fields between the version byte and the CRC.
// It is separate from journalDecodeEntry so that the fuzzer, which cannot
// forge a CRC, reaches it directly.
func journalParseEntry(b []byte) (*Entry, error) {
	r := journalReader{b: b}
	e := &Entry{
		Key:         r.str(),
		Operation:   r.str(),
		Method:      r.str(),
		URL:         r.str(),
		Fingerprint: r.str(),
	}
	e.State = journalStateName(r.byte(), &r)
	e.Created = r.time()
	e.Updated = r.time()
	e.Attempts = r.int()
	e.LastStatus = r.int()

	if names := r.count(); names > 0 {
		e.Header = make(http.Header, names)
		for range names {
			name := r.str()
			vals := make([]string, r.count())
			for i := range vals {
				vals[i] = r.str()
			}
			if r.err != nil {
				break
			}
			if _, dup := e.Header[name]; dup || len(vals) == 0 {
				r.fail("header %q repeated or empty", name)
				break
			}
			e.Header[name] = vals
		}
	}

	switch r.byte() {
	case 0:
	case 1:
		e.Body = bytes.Clone(r.bytes())
		if e.Body == nil {
			e.Body = []byte{} // stored and empty, which is not "not stored"
		}
	default:
		r.fail("bad body flag")
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err != nil {
		return nil, r.err
	}
	if e.Attempts < 0 {
		return nil, fmt.Errorf("%w: negative attempts %d", ErrJournalCorrupt, e.Attempts)
	}
	return e, nil
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

// sanitize returns the copy of e that Begin stores.
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
	rec.Header = nil
	for name, vals := range e.Header {
		if j.secret[http.CanonicalHeaderKey(name)] || len(vals) == 0 {
			continue
		}
		if rec.Header == nil {
			rec.Header = make(http.Header, len(e.Header))
		}
		rec.Header[name] = slices.Clone(vals)
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
