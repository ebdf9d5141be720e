package fingerprint

// The canonicaliser of the release before canonical JSON took linear
// time and encoding/json's name matching into account, kept as it was
// where it differs from this release's (see refCanon), as the oracle of
// TestCanonicalJSONMatchesPrevious: with names sorted by their bytes, the
// new one must give the same form, since the middleware accepts that
// release's fingerprints for the records it stored.

import (
	"bytes"
	"slices"
)

// refCanonicalJSON appends to dst the canonical form of the JSON text in
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

// refCanon is the previous release's canonicaliser: its value, object and
// array are kept as they were (each object reordered as it closes, names
// compared by their bytes); the lexical parts (strings, numbers, literals,
// whitespace), which it shared with this release unchanged, come from
// jsonCanon, whose fold stays false as the previous release sorted names.
// So the oracle differs from the code under test exactly where the
// releases differ: in how members are put in order.
type refCanon struct {
	jsonCanon
	scratch []byte // an object's members while they are reordered
}

// refMember is an object member's place in out: the member from begin to
// end, its name's decoded bytes from name to nameEnd.
type refMember struct{ begin, name, nameEnd, end int }

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
