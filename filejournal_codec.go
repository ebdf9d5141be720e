package idemhttp

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// The FileJournal file format.
//
// A journal is one file: a 24-byte file header, then batches appended one
// after another and never rewritten in place.
//
//	file header  "IDEMJRNL", u32 format version (fjVersion), u64 salt
//	             (random, new for every file), u32 CRC-32C of the 20 bytes
//	             before it
//	batch        u32 magic (fjBatchMagic xor the salt's low 32 bits), u32
//	             length of the records that follow, u64 sequence number,
//	             u32 CRC-32C of the salt, the batch's offset in the file
//	             (u64), the length, the sequence number and the records;
//	             then the records
//	record       u32 payload length, u32 CRC-32C of the length bytes and
//	             the payload; then the payload
//
// Integers in headers are little endian. A batch is what one group commit
// writes and syncs together; its sequence number is one more
// than the batch before it. A batch is written only after the batch
// before it is on disk, so a damaged batch followed by a valid later one
// is damage to data that was acknowledged (ErrJournalCorrupt), while a
// damaged batch with nothing valid after it is a write that the crash
// interrupted before anyone was told it succeeded: it is cut off.
//
// The salt and the offset in the CRC make a batch valid only in its own
// file and where it was written. When replay searches past damage for the
// next batch, a request body holding the bytes of a batch (by accident,
// or crafted to plant an entry that Resume would send with the live
// client's credentials) never passes for one: it would have to know the
// file's salt. The salted magic keeps that search linear: it finds only
// real batch starts, so CRCs are computed almost only for those.
//
// Each record carries its own CRC as well, so that a single entry read
// back from the file (Get, Pending, Resume) is checked without reading its
// whole batch.
//
// Record payloads start with a kind byte. Strings are a uvarint length and
// the bytes; times are a varint of Unix seconds and a uvarint of
// nanoseconds (UnixNano cannot hold the zero Time or dates past 2262);
// other integers are varints.
//
//	'B' begin   key, operation, method, URL, fingerprint, header (uvarint
//	            name count, then per name in sorted order: name, uvarint
//	            value count, values), created, updated, state byte,
//	            attempts, last status, body flag (0 not stored, 1 stored)
//	            and, if stored, the length-prefixed body
//	'F' finish  key, state byte, last status, attempts, updated. The
//	            values are the entry's new totals, not deltas, so a finish
//	            record applied twice (once folded into a compacted begin
//	            record, once replayed after it) gives the same entry.
//	'D' delete  key
const (
	fjVersion     = 3 // 1 and 2 were bbolt files, before the log
	fjFileHdrLen  = 24
	fjBatchMagic  = 0x314a4449 // "IDJ1" read as little endian
	fjBatchHdrLen = 20
	fjRecHdrLen   = 8

	fjKindBegin  = 'B'
	fjKindFinish = 'F'
	fjKindDelete = 'D'

	// fjMaxRecord bounds a record's payload and fjMaxBatch a batch's
	// records, so that a damaged length cannot make replay allocate or
	// skip gigabytes. A Begin whose record would exceed fjMaxRecord is
	// refused with ErrInvalidRequest.
	fjMaxRecord = 64 << 20
	fjMaxBatch  = 1 << 30
)

// fjFileMagic opens every journal file.
var fjFileMagic = [8]byte{'I', 'D', 'E', 'M', 'J', 'R', 'N', 'L'}

// journalCRC is the Castagnoli table: hardware-accelerated on amd64 and
// arm64, and the polynomial storage systems use to catch torn or flipped
// bytes.
var journalCRC = crc32.MakeTable(crc32.Castagnoli)

// State bytes. Stored as a byte, not the State string, so that an unknown
// byte is recognisably corrupt.
const (
	journalStatePending   = 1
	journalStateDone      = 2
	journalStateAbandoned = 3
)

// fjFileHeader returns the header of a new journal file with salt.
func fjFileHeader(salt uint64) []byte {
	h := make([]byte, fjFileHdrLen)
	copy(h, fjFileMagic[:])
	binary.LittleEndian.PutUint32(h[8:], fjVersion)
	binary.LittleEndian.PutUint64(h[12:], salt)
	binary.LittleEndian.PutUint32(h[20:], crc32.Checksum(h[:20], journalCRC))
	return h
}

// fjNewSalt returns a random salt for a new file.
func fjNewSalt() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// fjCheckFileHeader reports whether b starts with a journal file header
// this build can read, and returns the file's salt.
func fjCheckFileHeader(b []byte) (salt uint64, err error) {
	if len(b) < fjFileHdrLen || [8]byte(b[:8]) != fjFileMagic {
		return 0, fmt.Errorf("%w: not an idemhttp journal (journals written before format %d, by the bbolt engine, cannot be read: finish or delete them with the build that wrote them)", ErrJournalCorrupt, fjVersion)
	}
	if crc32.Checksum(b[:20], journalCRC) != binary.LittleEndian.Uint32(b[20:24]) {
		return 0, fmt.Errorf("%w: damaged file header", ErrJournalCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v != fjVersion {
		return 0, fmt.Errorf("%w: journal format version %d, this build reads version %d", ErrJournalCorrupt, v, fjVersion)
	}
	return binary.LittleEndian.Uint64(b[12:20]), nil
}

// fjMagic is the batch magic of a file with salt.
func fjMagic(salt uint64) uint32 { return fjBatchMagic ^ uint32(salt) }

// fjSealBatch fills in the header that b's first fjBatchHdrLen bytes
// reserve, for the records after it, for a batch written at file offset
// off in a file with salt.
func fjSealBatch(b []byte, seq uint64, off int64, salt uint64) {
	binary.LittleEndian.PutUint32(b[0:], fjMagic(salt))
	binary.LittleEndian.PutUint32(b[4:], uint32(len(b)-fjBatchHdrLen))
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint32(b[16:], fjBatchCRC(b[4:16], b[fjBatchHdrLen:], off, salt))
}

// fjBatchCRC is the CRC of a batch at offset off in a file with salt,
// with header fields hdr (length and sequence number) and records.
func fjBatchCRC(hdr, records []byte, off int64, salt uint64) uint32 {
	var pre [16]byte
	binary.LittleEndian.PutUint64(pre[:], salt)
	binary.LittleEndian.PutUint64(pre[8:], uint64(off))
	crc := crc32.Update(crc32.Checksum(pre[:], journalCRC), journalCRC, hdr)
	return crc32.Update(crc, journalCRC, records)
}

// fjReadBatch checks the batch at the start of b, which is at file offset
// off in a file with salt, and returns its sequence number, its records
// and its total length. ok is false for anything but a whole batch with a
// matching magic and CRC. It never panics and never allocates.
func fjReadBatch(b []byte, off int64, salt uint64) (seq uint64, records []byte, n int, ok bool) {
	if len(b) < fjBatchHdrLen || binary.LittleEndian.Uint32(b) != fjMagic(salt) {
		return 0, nil, 0, false
	}
	size := binary.LittleEndian.Uint32(b[4:])
	if size == 0 || size > fjMaxBatch || uint64(size) > uint64(len(b)-fjBatchHdrLen) {
		return 0, nil, 0, false
	}
	records = b[fjBatchHdrLen : fjBatchHdrLen+int(size)]
	if fjBatchCRC(b[4:16], records, off, salt) != binary.LittleEndian.Uint32(b[16:]) {
		return 0, nil, 0, false
	}
	return binary.LittleEndian.Uint64(b[8:]), records, fjBatchHdrLen + int(size), true
}

// fjAppendRecord frames payload as a record at the end of dst.
func fjAppendRecord(dst, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	crc := crc32.Update(crc32.Checksum(dst[len(dst)-4:], journalCRC), journalCRC, payload)
	dst = binary.LittleEndian.AppendUint32(dst, crc)
	return append(dst, payload...)
}

// fjReadRecord checks the record at the start of b and returns its
// payload and total length; ok is false for a short, oversized or
// mismatched record. It never panics and never allocates.
func fjReadRecord(b []byte) (payload []byte, n int, ok bool) {
	if len(b) < fjRecHdrLen {
		return nil, 0, false
	}
	size := binary.LittleEndian.Uint32(b)
	if size == 0 || size > fjMaxRecord || uint64(size) > uint64(len(b)-fjRecHdrLen) {
		return nil, 0, false
	}
	payload = b[fjRecHdrLen : fjRecHdrLen+int(size)]
	if crc32.Update(crc32.Checksum(b[:4], journalCRC), journalCRC, payload) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, 0, false
	}
	return payload, fjRecHdrLen + int(size), true
}

// fjRecord is one decoded record. Strings own their memory; body aliases
// the decoder's input.
type fjRecord struct {
	kind        byte
	key         string
	operation   string
	method      string
	url         string
	fingerprint string
	header      http.Header
	created     time.Time
	updated     time.Time
	state       byte
	attempts    int
	lastStatus  int
	hasBody     bool
	body        []byte
}

// entry returns the Entry a begin record describes, with its own copy of
// the body.
func (r *fjRecord) entry() *Entry {
	e := &Entry{
		Operation: r.operation, Key: r.key, Method: r.method, URL: r.url,
		Header: r.header, Fingerprint: r.fingerprint, Created: r.created, Updated: r.updated,
		Attempts: r.attempts, LastStatus: r.lastStatus, State: journalStateOf(r.state),
	}
	if r.hasBody {
		e.Body = append(make([]byte, 0, len(r.body)), r.body...)
	}
	return e
}

// fjBeginSize returns an upper bound of the encoded begin payload of e,
// and the header names it stores, sorted.
func fjBeginSize(e *Entry) (int, []string) {
	names := make([]string, 0, len(e.Header))
	// Fixed fields at their widest: the kind, five string lengths, the
	// header count, two times, the state, attempts, last status, the body
	// flag and length (varints take at most 10 bytes).
	n := 1 + 5*10 + 10 + 2*20 + 1 + 2*10 + 1 + 10
	n += len(e.Key) + len(e.Operation) + len(e.Method) + len(e.URL) + len(e.Fingerprint) + len(e.Body)
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
	return n, names
}

// fjAppendBegin appends the framed begin record of e (sanitised, with a
// known state) to dst. Header names without values carry no information
// and are dropped.
func fjAppendBegin(dst []byte, e *Entry) ([]byte, error) {
	st, ok := journalStateByte(e.State)
	if !ok {
		return dst, fmt.Errorf("entry %q: unknown state %q", e.Key, e.State)
	}
	size, names := fjBeginSize(e)
	if size > fjMaxRecord+fjBeginSlack {
		// Certainly too large: refuse before copying the body.
		return dst, fjTooLarge(e, size)
	}
	start := len(dst)
	dst = slices.Grow(dst, fjRecHdrLen+size)
	dst = append(dst, make([]byte, fjRecHdrLen)...) // length and CRC, filled in below
	dst = append(dst, fjKindBegin)
	dst = journalAppendString(dst, e.Key)
	dst = journalAppendString(dst, e.Operation)
	dst = journalAppendString(dst, e.Method)
	dst = journalAppendString(dst, e.URL)
	dst = journalAppendString(dst, e.Fingerprint)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		dst = journalAppendString(dst, name)
		vals := e.Header[name]
		dst = binary.AppendUvarint(dst, uint64(len(vals)))
		for _, v := range vals {
			dst = journalAppendString(dst, v)
		}
	}
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
	if n := len(dst) - start - fjRecHdrLen; n > fjMaxRecord {
		return dst[:start], fjTooLarge(e, n)
	}
	fjFinishRecord(dst[start:])
	return dst, nil
}

// fjBeginSlack is how much fjBeginSize may overestimate a begin record by:
// every varint counted at its widest.
const fjBeginSlack = 256

func fjTooLarge(e *Entry, size int) error {
	return fmt.Errorf("%w: entry %q of about %d bytes is too large for the journal (at most %d)", ErrInvalidRequest, e.Key, size, fjMaxRecord)
}

// fjFinishRecord fills in the length and CRC of the record that rec
// holds, whose header was reserved.
func fjFinishRecord(rec []byte) {
	binary.LittleEndian.PutUint32(rec, uint32(len(rec)-fjRecHdrLen))
	binary.LittleEndian.PutUint32(rec[4:], crc32.Update(crc32.Checksum(rec[:4], journalCRC), journalCRC, rec[fjRecHdrLen:]))
}

// fjAppendFinish appends a framed finish record to dst.
func fjAppendFinish(dst []byte, key string, state byte, status, attempts int, updated time.Time) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, fjRecHdrLen)...)
	dst = append(dst, fjKindFinish)
	dst = journalAppendString(dst, key)
	dst = append(dst, state)
	dst = binary.AppendVarint(dst, int64(status))
	dst = binary.AppendVarint(dst, int64(attempts))
	dst = journalAppendTime(dst, updated)
	fjFinishRecord(dst[start:])
	return dst
}

// fjAppendDelete appends a framed delete record to dst.
func fjAppendDelete(dst []byte, key string) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, fjRecHdrLen)...)
	dst = append(dst, fjKindDelete)
	dst = journalAppendString(dst, key)
	fjFinishRecord(dst[start:])
	return dst
}

// fjDecodeRecord parses a record's payload. Any malformed input gives an
// error wrapping [ErrJournalCorrupt]; it never panics, and allocates no
// more than the payload's length whatever it claims.
func fjDecodeRecord(p []byte) (*fjRecord, error) {
	r := journalReader{b: p}
	rec := &fjRecord{kind: r.byte()}
	switch rec.kind {
	case fjKindBegin:
		rec.key = r.str()
		rec.operation = r.str()
		rec.method = r.str()
		rec.url = r.str()
		rec.fingerprint = r.str()
		if names := r.count(); names > 0 {
			rec.header = make(http.Header, names)
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
				rec.header[name] = vals
			}
		}
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
	case fjKindFinish:
		rec.key = r.str()
		rec.state = r.state()
		rec.lastStatus = r.int()
		rec.attempts = r.int()
		rec.updated = r.time()
	case fjKindDelete:
		rec.key = r.str()
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
		return nil, fmt.Errorf("%w: negative attempts %d", ErrJournalCorrupt, rec.attempts)
	}
	if err := ValidateKey(rec.key); err != nil {
		return nil, fmt.Errorf("%w: record with a bad key", ErrJournalCorrupt)
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

// journalStateOf maps a state byte that decoding accepted to its State.
func journalStateOf(c byte) State {
	switch c {
	case journalStateDone:
		return StateDone
	case journalStateAbandoned:
		return StateAbandoned
	}
	return StatePending
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
	if sec == (time.Time{}).Unix() && nsec == 0 {
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
