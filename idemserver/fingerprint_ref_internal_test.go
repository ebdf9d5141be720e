package idemserver

// The canonicaliser of the release before canonical JSON took linear
// time and encoding/json's name matching into account, kept as it was as
// the oracle of TestCanonicalJSONMatchesPrevious: with names sorted by
// their bytes, the new one must give the same form, since the middleware
// accepts that release's fingerprints for the records it stored.

import (
	"bytes"
	"encoding/binary"
	"slices"
	"unicode/utf8"
)

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
func refCanonicalJSON(dst, in []byte, c *refCanon) ([]byte, bool) {
	if c == nil {
		c = new(refCanon)
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

type refCanon struct {
	in      []byte
	pos     int
	out     []byte
	scratch []byte // an object's members while they are reordered
	str     []byte // a string's decoded bytes, when it has escapes
}

// member is an object member's place in out: the member from begin to
// end, its name's decoded bytes from name to nameEnd.
type refMember struct{ begin, name, nameEnd, end int }

func (c *refCanon) space() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *refCanon) next(ch byte) bool {
	if c.pos < len(c.in) && c.in[c.pos] == ch {
		c.pos++
		return true
	}
	return false
}

func (c *refCanon) value(depth int) bool {
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

func (c *refCanon) literal(lit string, tag byte) bool {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return false
	}
	c.pos += len(lit)
	c.out = append(c.out, tag)
	return true
}

func (c *refCanon) object(depth int) bool {
	if depth > maxJSONDepth {
		return false
	}
	c.pos++ // '{'
	c.out = append(c.out, '{')
	base := len(c.out)
	var stack [8]refMember
	members := stack[:0]
	c.space()
	if !c.next('}') {
		for {
			c.space()
			if c.pos >= len(c.in) || c.in[c.pos] != '"' {
				return false
			}
			m := refMember{begin: len(c.out)}
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
	byName := func(a, b refMember) int {
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

func (c *refCanon) array(depth int) bool {
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
func (c *refCanon) string() (int, bool) {
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
func (c *refCanon) slowString(start int) (int, bool) {
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
				r, ok := refHex4(c.in[i:])
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
					lo, ok := refHex4(c.in[i+2:])
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

func refHex4(b []byte) (rune, bool) {
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

func (c *refCanon) appendString(s []byte) int {
	c.out = append(c.out, 's')
	c.out = binary.AppendUvarint(c.out, uint64(len(s)))
	at := len(c.out)
	c.out = append(c.out, s...)
	return at
}

// number reads a number as RFC 8259 spells it and appends its literal.
func (c *refCanon) number() bool {
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

func (c *refCanon) digits() int {
	n := 0
	for c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}
