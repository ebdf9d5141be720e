package postgres

import (
	"encoding/binary"
	"errors"
	"net/http"
	"strings"

	"github.com/idemkit/idemhttp"
)

// A done entry's Result is kept in the result column (bytea) as:
//
//	byte    version (1)
//	varint  status (zig-zag)
//	uvarint number of header names, then for each:
//	        uvarint length, the name; uvarint number of values, then
//	        for each: uvarint length, the value
//	uvarint 0 for a nil body, else the body's length plus one; the body
//
// Bytes, not jsonb: a response's header values may hold bytes that are
// not UTF-8, which jsonb would alter, and a body is binary; and the
// outcome must be stored whatever the server sent, since refusing it
// would leave a done operation pending.
const resultVersion = 1

// errResult reports a result column that does not decode.
var errResult = errors.New("malformed result")

// encodeResult returns r's encoding, nil for a nil r. Set-Cookie, in any
// letter case, and names without values are left out: a kept response is
// for the caller's rerun, and a session cookie must not rest on disk.
func encodeResult(r *idemhttp.Result) []byte {
	if r == nil {
		return nil
	}
	names := 0
	size := 1 + binary.MaxVarintLen64*2 + len(r.Body)
	for name, vals := range r.Header {
		if keepResultHeader(name, vals) {
			names++
			size += binary.MaxVarintLen64*2 + len(name)
			for _, v := range vals {
				size += binary.MaxVarintLen64 + len(v)
			}
		}
	}
	b := make([]byte, 0, size)
	b = append(b, resultVersion)
	b = binary.AppendVarint(b, int64(r.Status))
	b = binary.AppendUvarint(b, uint64(names))
	for name, vals := range r.Header {
		if !keepResultHeader(name, vals) {
			continue
		}
		b = appendString(b, name)
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = appendString(b, v)
		}
	}
	if r.Body == nil {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Body))+1)
	return append(b, r.Body...)
}

func keepResultHeader(name string, vals []string) bool {
	return len(vals) > 0 && !strings.EqualFold(name, "Set-Cookie")
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResult parses encodeResult's bytes. It never allocates more than
// the input could hold, and rejects any trailing byte.
func decodeResult(b []byte) (*idemhttp.Result, error) {
	if len(b) == 0 || b[0] != resultVersion {
		return nil, errResult
	}
	d := resultDecoder{b: b[1:]}
	status := d.varint()
	if int64(int(status)) != status {
		return nil, errResult
	}
	r := &idemhttp.Result{Status: int(status)}
	if names := d.count(); names > 0 {
		r.Header = make(http.Header, names)
		for range names {
			name := d.string()
			n := d.count()
			if d.err != nil {
				break
			}
			vals := make([]string, 0, n)
			for range n {
				vals = append(vals, d.string())
			}
			if n == 0 || d.err != nil {
				d.err = errResult
				break
			}
			r.Header[name] = vals
		}
		if d.err == nil && len(r.Header) != names {
			d.err = errResult // a name twice
		}
	}
	switch n := d.uvarint(); {
	case d.err != nil:
	case n == 0:
	case n-1 != uint64(len(d.b)):
		d.err = errResult
	default:
		r.Body = append([]byte{}, d.b...)
		d.b = nil
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errResult
	}
	return r, nil
}

// resultDecoder reads the fields of a result; the first error sticks.
type resultDecoder struct {
	b   []byte
	err error
}

func (d *resultDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errResult
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *resultDecoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errResult
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of items, each taking at least one byte: one
// larger than what is left is malformed, which bounds allocations.
func (d *resultDecoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = errResult
		return 0
	}
	return int(n)
}

func (d *resultDecoder) string() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
