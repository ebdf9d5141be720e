package servercore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
)

// The record is what a store keeps for a completed key: an opaque,
// non-empty byte string to the store, written and read only here. Its
// first byte is its format's version:
//
//   - 1, a stored response: the status as an unsigned varint, the number
//     of header fields, then per field in sorted order its name and its
//     values, each string prefixed by its length as a varint, and the body,
//     which runs to the end of the record;
//   - 2, the marker of a request that ran but whose response cannot be
//     replayed (too large to store, sent on a hijacked connection, or
//     committed by the handler apart from its record): the status as an
//     unsigned varint (0 when unknown) and nothing else.
//
// Both are read by every release since the first; a record starting with
// another byte was written by a newer (or a foreign) format and is refused
// as corrupt (503), never taken for a free key. A new format takes a new
// first byte, and is written only once every instance reads it
// (docs/server.md, "Formats and upgrades").
const (
	RecordFormat       = 1
	UnreplayableFormat = 2
)

// Errors of ParseRecord.
var (
	// ErrCorrupt: the record is not one this package wrote.
	ErrCorrupt = errors.New("corrupt response record")
	// ErrNotReplayable: the record is the marker of a response not kept.
	ErrNotReplayable = errors.New("idemserver: response not stored: it cannot be replayed")
	errTruncated     = errors.New("truncated")
)

// Unreplayable returns the record that keeps a key completed, not
// replayable, for a request that answered status (0 if unknown).
func Unreplayable(status int) []byte {
	return binary.AppendUvarint([]byte{UnreplayableFormat}, uint64(status))
}

// HopHeaders describe one connection, not the response, so a replay on
// another connection must not repeat them (RFC 9110, section 7.6.1).
var HopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// EncodeHead returns the record's head (format, status, header) in a
// slice with room for bodyHint more bytes. When keep is not nil, only the
// fields it accepts are encoded. The body is appended to it as it is.
func EncodeHead(status int, h http.Header, bodyHint int, keep func(name string, vs []string) bool) []byte {
	var stack [16]string // most responses have fewer header fields
	keys := stack[:0]
	n := 1 + uvarintLen(status) + bodyHint
	for k, vs := range h {
		if keep != nil && !keep(k, vs) {
			continue
		}
		keys = append(keys, k)
		n += uvarintLen(len(k)) + len(k) + uvarintLen(len(vs))
		for _, v := range vs {
			n += uvarintLen(len(v)) + len(v)
		}
	}
	n += uvarintLen(len(keys))
	slices.Sort(keys) // the same response always encodes the same way
	b := make([]byte, 0, n)
	b = append(b, RecordFormat)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = appendString(b, k)
		vs := h[k]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

// uvarintLen is the length of n's unsigned varint encoding.
func uvarintLen(n int) int {
	return (bits.Len64(uint64(n)|1) + 6) / 7
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ParseRecord decodes a record's status and body (a slice of record),
// and, when into is not nil, sets its header fields there. It checks the
// whole head before touching into, so a corrupt record leaves into as it
// was. The marker of a response not kept gives its status and
// ErrNotReplayable; anything this package did not write, an error
// wrapping ErrCorrupt. It allocates no more than the record's size, so a
// corrupt record cannot crash the server.
func ParseRecord(record []byte, into http.Header) (status int, body []byte, err error) {
	if len(record) > 0 && record[0] == UnreplayableFormat {
		d := decoder{b: record[1:]}
		s := d.uvarint()
		if d.err != nil || len(d.b) != 0 || (s != 0 && (s < 100 || s > 999)) {
			return 0, nil, fmt.Errorf("idemserver: %w: bad marker", ErrCorrupt)
		}
		return int(s), nil, ErrNotReplayable
	}
	if len(record) == 0 || record[0] != RecordFormat {
		return 0, nil, fmt.Errorf("idemserver: %w: unknown format", ErrCorrupt)
	}
	d := decoder{b: record[1:]}
	s := d.uvarint()
	d.header(nil)
	if d.err != nil {
		return 0, nil, fmt.Errorf("idemserver: %w: %w", ErrCorrupt, d.err)
	}
	if s < 100 || s > 999 {
		return 0, nil, fmt.Errorf("idemserver: %w: status %d", ErrCorrupt, s)
	}
	body = d.b
	if into != nil {
		d = decoder{b: record[1:]}
		d.uvarint()
		d.header(into)
	}
	return int(s), body, nil
}

// decoder reads a record; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

// header reads the header fields, setting them in into unless it is nil.
func (d *decoder) header(into http.Header) {
	nkeys := d.count()
	for i := uint64(0); i < nkeys && d.err == nil; i++ {
		k := d.bytes()
		nvals := d.count()
		if d.err != nil {
			return
		}
		var vs []string
		if into != nil {
			vs = make([]string, 0, nvals)
		}
		for j := uint64(0); j < nvals && d.err == nil; j++ {
			v := d.bytes()
			if into != nil {
				vs = append(vs, string(v))
			}
		}
		if into != nil && d.err == nil {
			into[string(k)] = vs
		}
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errTruncated
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of items, each at least one byte long, so a count
// beyond the remaining input is corrupt: refusing it bounds allocation.
func (d *decoder) count() uint64 {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.err = errors.New("count " + strconv.FormatUint(n, 10) + " beyond the record")
		return 0
	}
	return n
}

// bytes reads a length-prefixed string, as a slice of the record.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errTruncated
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
