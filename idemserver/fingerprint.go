package idemserver

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// DefaultFingerprint is the default [Middleware].Fingerprint. It identifies
// a request by meaning, as Stripe compares a retry's parameters with the
// first request's, so that a client library that re-encodes the same
// request differently on a retry is not refused with 422:
//
//   - method and escaped path, byte for byte;
//   - query parameters sorted by name (the values of one name keep their
//     order) and decoded, so ?b=2&a=1 and ?a=1&b=2 are one query;
//   - a JSON body (Content-Type application/json or any +json type) in a
//     canonical form: object members sorted by name, whitespace and string
//     escapes ignored, numbers kept as their literal text (1.0 and 1
//     differ), duplicate names kept in their order;
//   - a form body (application/x-www-form-urlencoded) with its fields
//     sorted as the query's are;
//   - any other body, and a JSON or form body that does not parse, byte for
//     byte.
//
// It returns the hex SHA-256 of those parts. A JSON body holding invalid
// UTF-8 or an unpaired surrogate escape, or nesting deeper than 1000, is
// compared byte for byte rather than guessed at: when in doubt two requests
// differ (a 422), never the other way (a replay of another request's
// response).
func DefaultFingerprint(r *http.Request, body []byte) string {
	var buf [512]byte // most request lines fit; longer ones spill to the heap
	b := append(buf[:0], r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	b = append(b, 0)
	b = appendCanonicalQuery(b, r.URL.RawQuery)
	b = append(b, 0)
	// A raw body's part is its SHA-256 alone, as before canonical forms
	// existed; a canonical one's is its SHA-256 and a byte naming the
	// form. NUL cannot occur in the parts before, so the two never read
	// alike.
	switch mediaKind(r.Header.Get("Content-Type")) {
	case kindJSON:
		if sum, ok := canonicalJSONSum(body); ok {
			b = append(append(b, sum[:]...), 'j')
			return sumHex(b)
		}
	case kindForm:
		if vs, err := url.ParseQuery(string(body)); err == nil && len(body) > 0 {
			sum := sha256.Sum256([]byte(vs.Encode()))
			b = append(append(b, sum[:]...), 'f')
			return sumHex(b)
		}
	}
	sum := sha256.Sum256(body)
	b = append(b, sum[:]...)
	return sumHex(b)
}

func sumHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// legacyFingerprint is the fingerprint of releases before canonical
// forms: the raw query and the raw body's SHA-256. The middleware accepts
// it for records stored by those releases, so that an upgrade does not
// turn their retries into 422s for a TTL.
func legacyFingerprint(r *http.Request, body []byte) string {
	bodySum := sha256.Sum256(body)
	var buf [512]byte
	b := append(buf[:0], r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	b = append(b, 0)
	b = append(b, r.URL.RawQuery...)
	b = append(b, 0)
	b = append(b, bodySum[:]...)
	return sumHex(b)
}

// appendCanonicalQuery appends the query with its parameters sorted by
// name and re-encoded, or, when it does not parse, as it is: a query that
// parses never reads like one that does not, since the canonical form
// always parses.
func appendCanonicalQuery(b []byte, raw string) []byte {
	if raw == "" {
		return b
	}
	vs, err := url.ParseQuery(raw)
	if err != nil {
		return append(b, raw...)
	}
	return append(b, vs.Encode()...)
}

type mediaClass int

const (
	kindRaw mediaClass = iota
	kindJSON
	kindForm
)

// mediaKind classifies a Content-Type value by its media type, ignoring
// parameters and case.
func mediaKind(ct string) mediaClass {
	if ct == "" {
		return kindRaw
	}
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	ct = strings.TrimSpace(ct)
	switch {
	case strings.EqualFold(ct, "application/json"):
		return kindJSON
	case strings.EqualFold(ct, "application/x-www-form-urlencoded"):
		return kindForm
	case len(ct) > 5 && strings.EqualFold(ct[len(ct)-5:], "+json") && strings.IndexByte(ct, '/') > 0:
		return kindJSON
	}
	return kindRaw
}

// maxJSONDepth bounds the nesting canonicalJSON follows; deeper documents
// are compared byte for byte.
const maxJSONDepth = 1000

// canonPool keeps the canonicaliser's buffers between requests: a fresh
// buffer per request was the fingerprint's largest cost.
var canonPool = sync.Pool{New: func() any { return new(canonBuffers) }}

type canonBuffers struct{ out, scratch, str []byte }

// maxPooledCanon bounds the buffers the pool keeps, so that one large body
// does not pin its buffers for good.
const maxPooledCanon = 64 << 10

// canonicalJSONSum returns the SHA-256 of in's canonical form (see
// canonicalJSON), and whether in was one JSON text.
func canonicalJSONSum(in []byte) (sum [32]byte, ok bool) {
	bufs := canonPool.Get().(*canonBuffers)
	// The canonicaliser itself lives on the stack: writing slices into a
	// pooled heap object costs a write barrier per append while the
	// collector runs.
	c := jsonCanon{scratch: bufs.scratch, str: bufs.str}
	out, ok := canonicalJSON(bufs.out[:0], in, &c)
	if ok {
		sum = sha256.Sum256(out)
	}
	if cap(out) <= maxPooledCanon && cap(c.scratch) <= maxPooledCanon && cap(c.str) <= maxPooledCanon {
		bufs.out, bufs.scratch, bufs.str = out[:0], c.scratch[:0], c.str[:0]
		canonPool.Put(bufs)
	}
	return sum, ok
}

// canonicalJSON appends to dst the canonical form of the JSON text in
// (RFC 8259: one value, surrounded by optional whitespace) and reports
// whether in was such a text. The form is an unambiguous encoding, not
// JSON: '{' members '}' with members sorted by name (stably), '[' elements
// ']', strings as 's', the length as a uvarint and the decoded bytes,
// numbers as 'n', the length and the literal text, and 't', 'f', 'z' for
// true, false and null. Two texts get one form exactly when they differ
// only in whitespace, member order and string escapes.
//
// c, when not nil, lends its scratch buffers.
func canonicalJSON(dst, in []byte, c *jsonCanon) ([]byte, bool) {
	if c == nil {
		c = new(jsonCanon)
	}
	c.in, c.pos, c.out = in, 0, dst
	c.space()
	if !c.value(0) {
		return dst, false
	}
	c.space()
	if c.pos != len(c.in) {
		return dst, false
	}
	return c.out, true
}

type jsonCanon struct {
	in      []byte
	pos     int
	out     []byte
	scratch []byte // an object's members while they are reordered
	str     []byte // a string's decoded bytes, when it has escapes
}

// member is an object member's place in out: the member from begin to
// end, its name's decoded bytes from name to nameEnd.
type member struct{ begin, name, nameEnd, end int }

func (c *jsonCanon) space() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *jsonCanon) next(ch byte) bool {
	if c.pos < len(c.in) && c.in[c.pos] == ch {
		c.pos++
		return true
	}
	return false
}

func (c *jsonCanon) value(depth int) bool {
	if c.pos >= len(c.in) {
		return false
	}
	switch c.in[c.pos] {
	case '{':
		return c.object(depth + 1)
	case '[':
		return c.array(depth + 1)
	case '"':
		_, ok := c.string()
		return ok
	case 't':
		return c.literal("true", 't')
	case 'f':
		return c.literal("false", 'f')
	case 'n':
		return c.literal("null", 'z')
	}
	return c.number()
}

func (c *jsonCanon) literal(lit string, tag byte) bool {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return false
	}
	c.pos += len(lit)
	c.out = append(c.out, tag)
	return true
}

func (c *jsonCanon) object(depth int) bool {
	if depth > maxJSONDepth {
		return false
	}
	c.pos++ // '{'
	c.out = append(c.out, '{')
	base := len(c.out)
	var stack [8]member
	members := stack[:0]
	c.space()
	if !c.next('}') {
		for {
			c.space()
			if c.pos >= len(c.in) || c.in[c.pos] != '"' {
				return false
			}
			m := member{begin: len(c.out)}
			name, ok := c.string()
			if !ok {
				return false
			}
			m.name, m.nameEnd = name, len(c.out)
			c.space()
			if !c.next(':') {
				return false
			}
			c.space()
			if !c.value(depth) {
				return false
			}
			m.end = len(c.out)
			members = append(members, m)
			c.space()
			if c.next(',') {
				continue
			}
			if c.next('}') {
				break
			}
			return false
		}
	}
	out := c.out // not c, which would then escape to the heap
	byName := func(a, b member) int {
		return bytes.Compare(out[a.name:a.nameEnd], out[b.name:b.nameEnd])
	}
	if !slices.IsSortedFunc(members, byName) {
		slices.SortStableFunc(members, byName)
		c.scratch = append(c.scratch[:0], c.out[base:]...)
		c.out = c.out[:base]
		for _, m := range members {
			c.out = append(c.out, c.scratch[m.begin-base:m.end-base]...)
		}
	}
	c.out = append(c.out, '}')
	return true
}

func (c *jsonCanon) array(depth int) bool {
	if depth > maxJSONDepth {
		return false
	}
	c.pos++ // '['
	c.out = append(c.out, '[')
	c.space()
	if !c.next(']') {
		for {
			c.space()
			if !c.value(depth) {
				return false
			}
			c.space()
			if c.next(',') {
				continue
			}
			if c.next(']') {
				break
			}
			return false
		}
	}
	c.out = append(c.out, ']')
	return true
}

// string reads a string and appends its form; it returns where the decoded
// bytes start in out.
func (c *jsonCanon) string() (int, bool) {
	c.pos++ // '"'
	start := c.pos
	for i := start; i < len(c.in); i++ {
		switch ch := c.in[i]; {
		case ch == '"':
			c.pos = i + 1
			return c.appendString(c.in[start:i]), true
		case ch == '\\' || ch < 0x20 || ch >= utf8.RuneSelf:
			return c.slowString(start)
		}
	}
	return 0, false
}

// slowString decodes a string with escapes or non-ASCII bytes from start,
// just past its opening quote.
func (c *jsonCanon) slowString(start int) (int, bool) {
	s := c.str[:0]
	i := start
	for i < len(c.in) {
		ch := c.in[i]
		switch {
		case ch == '"':
			c.pos = i + 1
			c.str = s
			return c.appendString(s), true
		case ch < 0x20:
			return 0, false
		case ch < utf8.RuneSelf && ch != '\\':
			s = append(s, ch)
			i++
		case ch >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(c.in[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, false // invalid UTF-8: compared byte for byte
			}
			s = append(s, c.in[i:i+size]...)
			i += size
		default: // '\\'
			if i+1 >= len(c.in) {
				return 0, false
			}
			esc := c.in[i+1]
			i += 2
			switch esc {
			case '"', '\\', '/':
				s = append(s, esc)
			case 'b':
				s = append(s, '\b')
			case 'f':
				s = append(s, '\f')
			case 'n':
				s = append(s, '\n')
			case 'r':
				s = append(s, '\r')
			case 't':
				s = append(s, '\t')
			case 'u':
				r, ok := hex4(c.in[i:])
				if !ok {
					return 0, false
				}
				i += 4
				switch {
				case r >= 0xDC00 && r <= 0xDFFF:
					return 0, false // a low surrogate alone
				case r >= 0xD800 && r <= 0xDBFF:
					if i+6 > len(c.in) || c.in[i] != '\\' || c.in[i+1] != 'u' {
						return 0, false
					}
					lo, ok := hex4(c.in[i+2:])
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, false
					}
					i += 6
					r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				}
				s = utf8.AppendRune(s, r)
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, ch := range b[:4] {
		switch {
		case ch >= '0' && ch <= '9':
			ch -= '0'
		case ch >= 'a' && ch <= 'f':
			ch = ch - 'a' + 10
		case ch >= 'A' && ch <= 'F':
			ch = ch - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(ch)
	}
	return r, true
}

func (c *jsonCanon) appendString(s []byte) int {
	c.out = append(c.out, 's')
	c.out = binary.AppendUvarint(c.out, uint64(len(s)))
	at := len(c.out)
	c.out = append(c.out, s...)
	return at
}

// number reads a number as RFC 8259 spells it and appends its literal.
func (c *jsonCanon) number() bool {
	start := c.pos
	c.next('-')
	switch {
	case c.next('0'):
	case c.digits() == 0:
		return false
	}
	if c.next('.') && c.digits() == 0 {
		return false
	}
	if c.next('e') || c.next('E') {
		if !c.next('+') {
			c.next('-')
		}
		if c.digits() == 0 {
			return false
		}
	}
	lit := c.in[start:c.pos]
	c.out = append(c.out, 'n')
	c.out = binary.AppendUvarint(c.out, uint64(len(lit)))
	c.out = append(c.out, lit...)
	return true
}

func (c *jsonCanon) digits() int {
	n := 0
	for c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}
