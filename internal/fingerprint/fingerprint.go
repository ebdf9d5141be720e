// Package fingerprint computes the fingerprints by which idemserver's
// middlewares tell a retry of a request from another request under the
// same idempotency key: [Current], and the earlier versions whose
// fingerprints records stored by earlier releases hold ([Older]).
//
// A fingerprint is a persisted format: a record keeps the fingerprint of
// the request that stored it for its TTL, across upgrades. Each version
// is pinned by testdata/fingerprint.golden (see TestFingerprintGolden):
// a change that alters any version's output fails it. A new version is
// added beside the others, never in place of one: the middlewares accept
// every earlier version (Older) for as long as records of it may live.
package fingerprint

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Current is the fingerprint of this release (version 3), the one
// idemserver's DefaultFingerprint returns and that the middlewares store.
// It identifies a request by meaning, as Stripe compares a retry's
// parameters with the first request's, so that a client library that
// re-encodes the same request differently on a retry is not refused with
// 422, while two requests a Go handler would tell apart never share a
// fingerprint. See idemserver.DefaultFingerprint for the parts.
func Current(r *http.Request, body []byte) string {
	return fingerprint(r, body, v3)
}

// Older reports whether stored is the fingerprint that an earlier
// version of [Current] gave r with body: version 2, version 1 (the
// release users run before this one), or version 0 (raw bytes). The
// middlewares accept those, when they use the default fingerprint, for
// the records earlier releases stored, so that an upgrade does not turn
// their retries into 422s for a TTL. They are computed only when called,
// which the middlewares do only when stored differs from Current.
//
// The price: an earlier version ignores what a later one tells apart
// (version 2 the Content-Type's parameters, version 1 JSON names that
// differ only in letter case), so for a record stored before the upgrade,
// and for its TTL only, a request that differs from the stored one in
// just that way is taken for it.
func Older(r *http.Request, body []byte, stored string) bool {
	return stored == fingerprint(r, body, v2) || stored == fingerprint(r, body, v1) || stored == raw(r, body)
}

// version says how a version of the fingerprint was made. Version 0 is
// raw (its own function).
type version struct {
	foldNames   bool // JSON members sorted by case-folded name, equal ones in order
	strictForm  bool // only bodies that read as forms are split into fields
	contentType bool // the Content-Type's media type and parameters are part of it
}

var (
	// v3 is Current's: version 2 and the Content-Type's media type and
	// parameters (a multipart boundary, a charset), which change what a
	// handler reads from the same bytes.
	v3 = version{foldNames: true, strictForm: true, contentType: true}
	// v2 sorts JSON names as encoding/json matches them and splits only
	// bodies that read as forms. It was never in a tagged release.
	v2 = version{foldNames: true, strictForm: true}
	// v1 is that of the release users run before this one (commit
	// 2d053bb, the first to compare by meaning): members sorted by their
	// bytes, any body that parsed as a form split into fields.
	v1 = version{}
)

// V1 and V2 are the fingerprints of versions 1 and 2, for tests of the
// middlewares that store records as earlier releases did.
func V1(r *http.Request, body []byte) string { return fingerprint(r, body, v1) }

// V2: see V1.
func V2(r *http.Request, body []byte) string { return fingerprint(r, body, v2) }

// V0 is the fingerprint of the releases before canonical forms: see V1.
func V0(r *http.Request, body []byte) string { return raw(r, body) }

func fingerprint(r *http.Request, body []byte, v version) string {
	var buf [512]byte // most request lines fit; longer ones spill to the heap
	b := append(buf[:0], r.Method...)
	b = append(b, 0)
	b = append(b, r.URL.EscapedPath()...)
	b = append(b, 0)
	b = appendCanonicalQuery(b, r.URL.RawQuery)
	b = append(b, 0)
	b = appendBody(b, r, body, v)
	if v.contentType {
		// After the body's part, whose length (32 or 33 bytes) tells
		// version 3's inputs from those of versions 1 and 2, which the
		// middleware accepts too: no request's fingerprint of one version
		// is another request's of another. (Neither method, path nor query
		// holds a NUL: net/http and net/url refuse them.)
		b = append(b, 'c')
		b = appendContentType(b, r.Header["Content-Type"])
	}
	return sumHex(b)
}

// appendBody appends the body's part of the fingerprint.
func appendBody(b []byte, r *http.Request, body []byte, v version) []byte {
	// A raw body's part is its SHA-256 alone, as before canonical forms
	// existed; a canonical one's is its SHA-256 and a byte naming the
	// form. NUL cannot occur in the parts before, so the two never read
	// alike. The JSON form with folded names has a byte of its own, so
	// that no request's fingerprint of one version is another request's
	// of the other: the middleware accepts both.
	switch mediaKind(r.Header.Get("Content-Type")) {
	case kindJSON:
		if sum, ok := canonicalJSONSum(body, v.foldNames); ok {
			tag := byte('j')
			if v.foldNames {
				tag = 'J'
			}
			return append(append(b, sum[:]...), tag)
		}
	case kindForm:
		if len(body) > 0 && (!v.strictForm || plainForm(body)) {
			if vs, err := url.ParseQuery(string(body)); err == nil {
				sum := sha256.Sum256([]byte(vs.Encode()))
				return append(append(b, sum[:]...), 'f')
			}
		}
	}
	sum := sha256.Sum256(body)
	return append(b, sum[:]...)
}

// appendContentType appends the Content-Type field's values in a form
// that is the same for two values a handler reads alike and differs
// otherwise: the media type in lower case, then its parameters sorted by
// name (in lower case), each name and value prefixed by its length, so
// that no value can pass for another's parameters; a charset's value is
// compared without regard to case (its names are case-insensitive), and
// charset=utf-8 is dropped for JSON, whose only encoding UTF-8 is (RFC
// 8259). A field that does not parse, or that appears more than once,
// is taken byte for byte, after a byte of its own: when in doubt two
// requests differ.
func appendContentType(b []byte, values []string) []byte {
	if len(values) != 1 {
		b = append(b, 'r')
		for _, v := range values {
			b = appendLenString(b, v)
		}
		return b
	}
	ct := values[0]
	if strings.IndexByte(ct, ';') < 0 && strings.IndexByte(ct, '"') < 0 {
		// The common case, a media type alone: no parser, no allocation.
		mt := strings.TrimSpace(ct)
		if validToken(mt) {
			b = append(b, 'm')
			b = binary.AppendUvarint(b, uint64(len(mt)))
			for i := 0; i < len(mt); i++ {
				c := mt[i]
				if 'A' <= c && c <= 'Z' {
					c += 'a' - 'A'
				}
				b = append(b, c)
			}
			return binary.AppendUvarint(b, 0) // no parameters
		}
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return appendLenString(append(b, 'r'), ct)
	}
	if cs, ok := params["charset"]; ok {
		cs = strings.ToLower(cs)
		params["charset"] = cs
		if cs == "utf-8" && mediaKind(mt) == kindJSON {
			delete(params, "charset")
		}
	}
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	slices.Sort(names)
	b = appendLenString(append(b, 'm'), mt)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendLenString(b, name)
		b = appendLenString(b, params[name])
	}
	return b
}

// validToken reports whether mt is type "/" subtype, each an RFC 9110
// token: what mime.ParseMediaType accepts of a field without parameters.
func validToken(mt string) bool {
	slash := strings.IndexByte(mt, '/')
	if slash <= 0 || slash == len(mt)-1 {
		return false
	}
	for i := 0; i < len(mt); i++ {
		c := mt[i]
		if i == slash {
			continue
		}
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`()<>@,;:\"/[]?={}`, c) >= 0 {
			return false
		}
	}
	return true
}

func appendLenString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// plainForm reports whether body holds only bytes a form encoder may
// leave unescaped: no double quote, brace or backslash (which every JSON
// object or string holds), whitespace, control or non-ASCII byte.
func plainForm(body []byte) bool {
	for _, c := range body {
		if c <= ' ' || c >= 0x7f || c == '"' || c == '{' || c == '}' || c == '\\' {
			return false
		}
	}
	return true
}

func sumHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// raw is the fingerprint of releases before canonical forms (version 0):
// the raw query and the raw body's SHA-256.
func raw(r *http.Request, body []byte) string {
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

type canonBuffers struct {
	out, fin, str []byte
	stack, kids   []canonKid
	nodes         []canonNode
}

// maxPooledCanon bounds the buffers the pool keeps, so that one large body
// does not pin its buffers for good.
const maxPooledCanon = 64 << 10

// canonicalJSONSum returns the SHA-256 of in's canonical form (see
// canonicalJSON), and whether in was one JSON text. fold sorts members
// as encoding/json matches names (fingerprintVersion.foldNames).
func canonicalJSONSum(in []byte, fold bool) (sum [32]byte, ok bool) {
	bufs := canonPool.Get().(*canonBuffers)
	// The canonicaliser itself lives on the stack: writing slices into a
	// pooled heap object costs a write barrier per append while the
	// collector runs.
	c := jsonCanon{str: bufs.str, fin: bufs.fin, stack: bufs.stack, kids: bufs.kids, nodes: bufs.nodes, fold: fold}
	form, ok := canonicalJSON(bufs.out[:0], in, &c)
	if ok {
		sum = sha256.Sum256(form)
	}
	if cap(c.out) <= maxPooledCanon && cap(c.fin) <= maxPooledCanon && cap(c.str) <= maxPooledCanon &&
		cap(c.stack) <= maxPooledCanon/32 && cap(c.kids) <= maxPooledCanon/32 && cap(c.nodes) <= maxPooledCanon/32 {
		*bufs = canonBuffers{out: c.out[:0], fin: c.fin[:0], str: c.str[:0], stack: c.stack[:0], kids: c.kids[:0], nodes: c.nodes[:0]}
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
// only in whitespace, member order and string escapes. Names sort by
// their bytes, or, with c.fold, as encoding/json matches them (see
// compareNames).
//
// It takes time linear in the input, whatever its nesting. A first pass
// writes the form with every object's members in their input order,
// noting, for each object out of order or holding one, where its members
// begin and end; the rest of the form is final as written. When anything
// is out of order, a second pass copies the form once more, each such
// object's members in sorted order. (Sorting each object as it closed, by
// copying its members back in order, copied every byte once per object
// around it: 26 times the time of a flat body for one 999 deep.)
//
// c, when not nil, lends its scratch buffers and says how names sort.
func canonicalJSON(dst, in []byte, c *jsonCanon) ([]byte, bool) {
	if c == nil {
		c = new(jsonCanon)
	}
	if cap(dst)-len(dst) < len(in) {
		// The form is about as long as the text: one allocation rather
		// than a doubling series.
		dst = slices.Grow(dst, len(in)+len(in)/16)
	}
	c.in, c.pos, c.out = in, 0, dst
	c.stack, c.kids, c.nodes = c.stack[:0], c.kids[:0], c.nodes[:0]
	c.space()
	root, ok := c.value(0)
	if !ok {
		return dst, false
	}
	c.space()
	if c.pos != len(c.in) {
		return dst, false
	}
	if root < 0 {
		return c.out, true // in order throughout: the first pass's form is final
	}
	c.fin = append(slices.Grow(c.fin[:0], len(c.out)), c.out[:len(dst)]...)
	c.fin = c.emit(c.fin, c.nodes[root])
	return c.fin, true
}

type jsonCanon struct {
	in   []byte
	pos  int
	out  []byte // the first pass's form
	fin  []byte // the second pass's form, when there is one
	str  []byte // a string's decoded bytes, when it has escapes
	fold bool   // names sort as encoding/json matches them

	// The objects and arrays the second pass must rewrite: those out of
	// order or holding one. Each is a node; its members (objects) or its
	// elements that are nodes (arrays) are kids, contiguous per node.
	stack []canonKid // kids of the nodes still open
	kids  []canonKid
	nodes []canonNode
}

// canonKid is an object member, or an array element that is a node, in
// out: from begin to end; for a member, its name's decoded bytes from
// name to nameEnd, where its value starts. node is the value's node, or
// -1 for a value already final in out.
type canonKid struct{ begin, name, nameEnd, end, node int }

// canonNode is an object or array to rewrite: its form from begin to end
// in out, and its kids, kids[first:first+n].
type canonNode struct {
	begin, end, first, n int
	object               bool
}

// emit appends node n's final form to dst.
func (c *jsonCanon) emit(dst []byte, n canonNode) []byte {
	kids := c.kids[n.first : n.first+n.n]
	if n.object {
		dst = append(dst, '{')
		for _, k := range kids {
			if k.node < 0 {
				dst = append(dst, c.out[k.begin:k.end]...)
				continue
			}
			dst = append(dst, c.out[k.begin:k.nameEnd]...)
			dst = c.emit(dst, c.nodes[k.node])
		}
		return append(dst, '}')
	}
	at := n.begin // the array's '[' and the elements already final run through
	for _, k := range kids {
		dst = append(dst, c.out[at:k.begin]...)
		dst = c.emit(dst, c.nodes[k.node])
		at = k.end
	}
	return append(dst, c.out[at:n.end]...)
}

// compareNames orders member names: by their bytes, or, with fold, as
// encoding/json matches a member to a field: letter case ignored (each
// rune stands for the smallest of its Unicode simple folding orbit, so
// "K", "k" and the Kelvin sign are one), names equal that way comparing
// equal, so that a stable sort keeps them in their order. The order of
// such names is the meaning to a Go handler: the last one wins.
func compareNames(a, b []byte, fold bool) int {
	if !fold {
		return bytes.Compare(a, b)
	}
	for len(a) > 0 && len(b) > 0 {
		ca, cb := a[0], b[0]
		if ca < utf8.RuneSelf && cb < utf8.RuneSelf {
			if 'a' <= ca && ca <= 'z' {
				ca -= 'a' - 'A'
			}
			if 'a' <= cb && cb <= 'z' {
				cb -= 'a' - 'A'
			}
			if ca != cb {
				return cmp.Compare(ca, cb)
			}
			a, b = a[1:], b[1:]
			continue
		}
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if ra, rb = foldRune(ra), foldRune(rb); ra != rb {
			return cmp.Compare(ra, rb)
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// foldRune returns the smallest rune of r's simple folding orbit, as
// encoding/json folds names (for ASCII letters, the capital).
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

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

// value reads a value and appends its form; it returns the value's node,
// or -1 when its form in out is final.
func (c *jsonCanon) value(depth int) (int, bool) {
	if c.pos >= len(c.in) {
		return -1, false
	}
	switch c.in[c.pos] {
	case '{':
		return c.object(depth + 1)
	case '[':
		return c.array(depth + 1)
	case '"':
		_, ok := c.string()
		return -1, ok
	case 't':
		return -1, c.literal("true", 't')
	case 'f':
		return -1, c.literal("false", 'f')
	case 'n':
		return -1, c.literal("null", 'z')
	}
	return -1, c.number()
}

func (c *jsonCanon) literal(lit string, tag byte) bool {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(lit)) {
		return false
	}
	c.pos += len(lit)
	c.out = append(c.out, tag)
	return true
}

func (c *jsonCanon) object(depth int) (int, bool) {
	if depth > maxJSONDepth {
		return -1, false
	}
	begin := len(c.out)
	c.pos++ // '{'
	c.out = append(c.out, '{')
	base := len(c.stack)
	rewrite := false // a member's value is a node
	c.space()
	if !c.next('}') {
		for {
			c.space()
			if c.pos >= len(c.in) || c.in[c.pos] != '"' {
				return -1, false
			}
			k := canonKid{begin: len(c.out)}
			name, ok := c.string()
			if !ok {
				return -1, false
			}
			k.name, k.nameEnd = name, len(c.out)
			c.space()
			if !c.next(':') {
				return -1, false
			}
			c.space()
			if k.node, ok = c.value(depth); !ok {
				return -1, false
			}
			k.end = len(c.out)
			rewrite = rewrite || k.node >= 0
			c.stack = append(c.stack, k)
			c.space()
			if c.next(',') {
				continue
			}
			if c.next('}') {
				break
			}
			return -1, false
		}
	}
	c.out = append(c.out, '}')
	members := c.stack[base:]
	out, fold := c.out, c.fold // not c, which would then escape to the heap
	byName := func(a, b canonKid) int {
		return compareNames(out[a.name:a.nameEnd], out[b.name:b.nameEnd], fold)
	}
	if !slices.IsSortedFunc(members, byName) {
		slices.SortStableFunc(members, byName)
		rewrite = true
	}
	return c.close(begin, base, rewrite, true), true
}

// close ends a node begun at begin whose kids are c.stack[base:]: when it
// needs no rewrite, it drops them and returns -1; otherwise it records
// the node and returns its index.
func (c *jsonCanon) close(begin, base int, rewrite, object bool) int {
	if !rewrite {
		c.stack = c.stack[:base]
		return -1
	}
	c.nodes = append(c.nodes, canonNode{begin: begin, end: len(c.out), first: len(c.kids), n: len(c.stack) - base, object: object})
	c.kids = append(c.kids, c.stack[base:]...)
	c.stack = c.stack[:base]
	return len(c.nodes) - 1
}

func (c *jsonCanon) array(depth int) (int, bool) {
	if depth > maxJSONDepth {
		return -1, false
	}
	begin := len(c.out)
	c.pos++ // '['
	c.out = append(c.out, '[')
	base := len(c.stack)
	c.space()
	if !c.next(']') {
		for {
			c.space()
			k := canonKid{begin: len(c.out)}
			var ok bool
			if k.node, ok = c.value(depth); !ok {
				return -1, false
			}
			if k.node >= 0 { // only elements to rewrite are kids
				k.end = len(c.out)
				c.stack = append(c.stack, k)
			}
			c.space()
			if c.next(',') {
				continue
			}
			if c.next(']') {
				break
			}
			return -1, false
		}
	}
	c.out = append(c.out, ']')
	return c.close(begin, base, len(c.stack) > base, false), true
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
