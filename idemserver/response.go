package idemserver

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
)

// recordFormat is the first byte of a record; a record that starts with
// another value was written by a newer (or a foreign) format.
const recordFormat = 1

// unreplayableFormat is the first byte of the record kept for a response
// that ran but cannot be replayed (too large to store, or sent on a
// hijacked connection): the format byte, then the status as an unsigned
// varint (0 when unknown: a hijack before any status), and nothing else.
// It marks the key as completed, so a retry is refused rather than run a
// second time.
const unreplayableFormat = 2

var (
	errCorrupt       = errors.New("corrupt response record")
	errTruncated     = errors.New("truncated")
	errNotReplayable = errors.New("idemserver: response not stored: it cannot be replayed")
)

// encodeUnreplayable returns the record for a response with status that
// was not kept.
func encodeUnreplayable(status int) []byte {
	return binary.AppendUvarint([]byte{unreplayableFormat}, uint64(status))
}

// Response is a stored response, decoded: what a replay sends back.
type Response struct {
	Status int         // HTTP status code, 100-999
	Header http.Header // response header as the handler sent it, minus hop-by-hop fields
	Body   []byte      // the whole response body
}

// MarshalBinary encodes r as a record, the form in which a [Store] keeps
// responses: a format byte (1), the status as an unsigned varint, the
// number of header fields, then per field in sorted order its name and its
// values, each string prefixed by its length as a varint, and finally the
// body, which runs to the end of the record. It fails only for a status
// outside 100-999, which no HTTP response has.
func (r *Response) MarshalBinary() ([]byte, error) {
	if r.Status < 100 || r.Status > 999 {
		return nil, fmt.Errorf("idemserver: encode response: invalid status %d", r.Status)
	}
	b := encodeHead(r.Status, r.Header, len(r.Body), nil)
	return append(b, r.Body...), nil
}

// UnmarshalBinary decodes a record written by [Response.MarshalBinary] or
// by the middleware, replacing r's contents; it copies what it keeps. It
// refuses a truncated record, an unknown format and a status outside
// 100-999, and allocates no more than the record's size, so a corrupt
// record cannot crash the server. The marker of a request that ran but
// whose response was not kept ([NotReplayableRecord]) holds no response:
// for it, UnmarshalBinary sets only Status (the handler's, 0 if unknown)
// and returns an error wrapping [ErrResponseNotKept].
func (r *Response) UnmarshalBinary(record []byte) error {
	h := http.Header{}
	status, body, err := parseRecord(record, h)
	if errors.Is(err, errNotReplayable) {
		*r = Response{Status: status}
		return err
	}
	if err != nil {
		return err
	}
	if len(h) == 0 {
		h = nil
	}
	if len(body) == 0 {
		body = nil
	}
	*r = Response{Status: status, Header: h, Body: slices.Clone(body)}
	return nil
}

// hopHeaders describe one connection, not the response, so a replay on
// another connection must not repeat them (RFC 9110, section 7.6.1).
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// encodeHead returns the record's head (format, status, header) in a slice
// with room for bodyHint more bytes. When keep is not nil, only the fields
// it accepts are encoded.
func encodeHead(status int, h http.Header, bodyHint int, keep func(name string, vs []string) bool) []byte {
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
	b = append(b, recordFormat)
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

// parseRecord decodes a record's status and body (a slice of record), and,
// when into is not nil, sets its header fields there. It checks the whole
// head before touching into, so a corrupt record leaves into as it was.
func parseRecord(record []byte, into http.Header) (status int, body []byte, err error) {
	if len(record) > 0 && record[0] == unreplayableFormat {
		d := decoder{b: record[1:]}
		s := d.uvarint()
		if d.err != nil || len(d.b) != 0 || (s != 0 && (s < 100 || s > 999)) {
			return 0, nil, fmt.Errorf("idemserver: %w: bad marker", errCorrupt)
		}
		return int(s), nil, errNotReplayable
	}
	if len(record) == 0 || record[0] != recordFormat {
		return 0, nil, fmt.Errorf("idemserver: %w: unknown format", errCorrupt)
	}
	d := decoder{b: record[1:]}
	s := d.uvarint()
	d.header(nil)
	if d.err != nil {
		return 0, nil, fmt.Errorf("idemserver: %w: %w", errCorrupt, d.err)
	}
	if s < 100 || s > 999 {
		return 0, nil, fmt.Errorf("idemserver: %w: status %d", errCorrupt, s)
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
