package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idemhttp/internal/plant"
)

// This file makes "byte-identical on every attempt" hold for every body.
//
// A body of known length up to MaxBodyBytes, and any body a journal must
// store, is read into memory once, before the first attempt, and every
// attempt sends that buffer: identical by construction, whatever GetBody
// would have returned and whatever the caller did to req.Body after
// NewRequest. (net/http writes an in-memory body together with the
// request head, in one write.) That costs one copy of the body, except
// for a string (a strings.Reader's), kept as it is: its bytes cannot
// change (stringCatcher). A []byte is copied: the caller's slice may
// change after Do returns (or between attempts, from another goroutine),
// and a Write's bytes may be a reader's reused buffer, which nothing
// tells apart from a slice that stays put. The fast path that sent
// req.Body itself when its GetBody looked like http.NewRequest's
// (recognised by the closure's code pointer) is gone: it broke when the
// caller swapped req.Body, and it reached into net/http's internals
// (BenchmarkDoInterleaved, bench/README.md).
//
// A larger body, or one of unknown length, with GetBody is streamed: the
// first attempt sends req.Body and sets the reference (its length n and a
// seeded maphash of its bytes; when, and which body is it, is bodyRef's
// rule), and every later body, from GetBody, is checked against it as it
// goes out. It holds back byte n of the
// reference until the whole body is known to match, and fails as soon as
// more than n bytes arrive, so a changed body (longer, shorter or the same
// length) is never completely delivered, with a Content-Length, chunked
// or over HTTP/2: the server sees a truncated request, which it cannot act
// on, and the call stops with ErrBodyChanged.
//
// maphash rather than SHA-256: the threat is a buggy GetBody, not an
// adversary, and the seed is random per process, so a collision cannot be
// crafted; it hashes at memory speed and allocates nothing.

// bodySeed seeds every body hash of this process.
var bodySeed = maphash.MakeSeed()

// replayableBody makes req's body resendable. It returns the whole body in
// memory when it must (needBytes: a journal stores it), when the request
// has no GetBody (up to maxBody), or when its length is known and at most
// maxBody; then req.Body is read and closed. The body in memory is a copy
// of its bytes, or, when the body hands over a string (a strings.Reader
// does, through WriteTo; see stringCatcher) and no journal needs bytes,
// that string itself. Otherwise it returns the request's GetBody, and
// req.Body stays open: the first attempt streams it, as net/http would.
//
// c is the call's stringCatcher, which lives in the call state: a
// WriteTo's writer escapes, and would be one more allocation per call.
func replayableBody(req *http.Request, needBytes bool, maxBody int64, c *stringCatcher) (memBody, func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return memBody{}, nil, nil
	}
	if req.GetBody != nil && !needBytes && (req.ContentLength <= 0 || req.ContentLength > maxBody) {
		return memBody{}, req.GetBody, nil
	}
	defer closeBody(req)
	if wt, ok := req.Body.(io.WriterTo); ok && !needBytes && req.ContentLength > 0 {
		// The length is known and at most maxBody: the usual body of
		// http.NewRequest over an in-memory reader, whose WriteTo hands
		// the bytes over at once.
		*c = stringCatcher{max: maxBody, want: req.ContentLength}
		_, err := wt.WriteTo(c)
		m := c.body()
		*c = stringCatcher{} // keep nothing of the body here
		if err != nil {
			m, err = memBody{}, readBodyErr(err, maxBody)
		}
		return m, nil, err
	}
	m, err := readBody(req.Body, req.ContentLength, maxBody)
	return m, nil, err
}

// readBodyErr is the error of a body that could not be read whole: too
// large (errBodyTooLarge), or the reader's error.
//
//go:noinline
func readBodyErr(err error, maxBody int64) error {
	if errors.Is(err, errBodyTooLarge) {
		return fmt.Errorf("idemhttp: %w: body larger than MaxBodyBytes (%d)", ErrNotReplayable, maxBody)
	}
	return fmt.Errorf("idemhttp: %w: read body: %w", ErrInvalidRequest, err)
}

// readBody reads body, of length n (0 or less: unknown), into memory, up
// to maxBody bytes: replayableBody's way for a body without WriteTo, or
// whose bytes the journal needs.
//
//go:noinline
func readBody(body io.Reader, n, maxBody int64) (memBody, error) {
	// Sized from Content-Length (+1 so reaching EOF needs no growth):
	// bytes.Buffer.ReadFrom would double a 1 KiB buffer to keep 512 bytes
	// free, for every request.
	size := 512
	if n > 0 && n <= maxBody {
		size = int(n) + 1
	}
	buf := make([]byte, 0, size)
	r := io.LimitReader(body, maxBody+1)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return memBody{}, fmt.Errorf("idemhttp: %w: read body: %w", ErrInvalidRequest, err)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
	if int64(len(buf)) > maxBody {
		return memBody{}, fmt.Errorf("idemhttp: %w: body larger than MaxBodyBytes (%d)", ErrNotReplayable, maxBody)
	}
	if len(buf) == 0 {
		return memBody{}, nil
	}
	return memBody{b: buf}, nil
}

// memBody is a request body held in memory, which every attempt sends
// whole: a copy of its bytes (b), or a string (s, with str set), whose
// bytes nobody can change.
type memBody struct {
	b   []byte
	s   string
	str bool
}

func (m memBody) len() int { return len(m.b) + len(m.s) }

// stringCatcher is the io.Writer a body's WriteTo writes to, in
// replayableBody. A string handed over whole, in one WriteString call
// before any other write, is kept as it is, without a copy: no one can
// change a string's bytes, so every attempt sends exactly those bytes
// however long the call holds them, and the caller's buffers are not
// touched. (strings.Reader.WriteTo calls io.WriteString, which calls
// WriteString: an http.NewRequest over a strings.Reader sends its string
// with no copy.) Bytes handed to Write are copied, as io.Writer's
// contract requires: the reader may reuse or change them after Write
// returns (a bytes.Reader hands over the caller's own slice, which the
// caller may change after Do returns; a bufio.Reader its buffer). Past
// max bytes it fails with errBodyTooLarge.
type stringCatcher struct {
	s    string
	b    []byte
	max  int64
	want int64 // the declared length, to size the copy
	n    int64
	str  bool // s holds the whole body so far
}

// errBodyTooLarge stops a WriteTo past MaxBodyBytes.
var errBodyTooLarge = errors.New("idemhttp: body larger than MaxBodyBytes")

func (c *stringCatcher) WriteString(s string) (int, error) {
	if c.n+int64(len(s)) > c.max {
		return 0, errBodyTooLarge
	}
	if c.n == 0 {
		c.s, c.str, c.n = s, true, int64(len(s))
		return len(s), nil
	}
	c.spill()
	c.b = append(c.b, s...)
	c.n += int64(len(s))
	return len(s), nil
}

func (c *stringCatcher) Write(p []byte) (int, error) {
	if c.n+int64(len(p)) > c.max {
		return 0, errBodyTooLarge
	}
	if c.str {
		c.spill()
	}
	if c.b == nil && (c.want <= 0 || int64(len(p)) >= c.want) {
		c.b = append([]byte(nil), p...) // a copy (p is not ours to keep), in one allocation not zeroed first
	} else {
		c.appendMore(p)
	}
	c.n += int64(len(p))
	return len(p), nil
}

// appendMore is Write of a body that comes in more than one piece: a copy
// of p appended, p not being ours to keep.
//
//go:noinline
func (c *stringCatcher) appendMore(p []byte) {
	if c.b == nil {
		c.b = make([]byte, 0, c.want)
	}
	c.b = append(c.b, p...)
}

// spill turns a string kept so far into bytes, to append to.
//
//go:noinline
func (c *stringCatcher) spill() {
	if c.str {
		c.b = append(make([]byte, 0, len(c.s)*2), c.s...)
		c.s, c.str = "", false
	}
}

func (c *stringCatcher) body() memBody {
	switch {
	case c.str && c.s != "":
		return memBody{s: c.s, str: true}
	case len(c.b) > 0:
		return memBody{b: c.b}
	}
	return memBody{}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// bodyRef is the reference a call's streamed bodies are compared with.
// Bodies are read by net/http's write loops, which may still run after
// RoundTrip returned, so it is guarded by a mutex.
//
// Which body is the reference, and when it is known, is decided so that
// no two different bodies can both reach the server whole, whatever
// order the server's answer and the reading of the bodies take (issue 31
// §1.13):
//   - A body of declared length n is whole for the server once its n
//     bytes are out, before net/http reads on to see its end (HTTP/1.1
//     writes them straight to the connection, then reads once more): so
//     the reference is recorded when n bytes were read, not at EOF. A body
//     of unknown length is whole only once its end is written (the last
//     chunk, END_STREAM), which comes after EOF.
//   - A later body (from GetBody) decides at its first Read, not when it
//     is made: it waits until the reference is known, or until every
//     earlier body is closed without making one (then none of them can be
//     whole, and it becomes the reference itself). A server may answer
//     before reading a body, and net/http may still be writing one after
//     the attempt ended, so an earlier body is in doubt until it is closed.
//     The wait is short (bodyWaitLimit): net/http closes a body it is done
//     with soon after, but HTTP/2's Transport calls GetBody for a retry of
//     its own before it closes the body it gives up. A later body that
//     waited that long fails, unsent: its attempt fails (its outcome is
//     then unknown, as for any body cut short), and the next attempt asks
//     again. Failing costs an attempt; sending it unchecked could run two
//     bodies under one key.
type bodyRef struct {
	mu      sync.Mutex
	set     bool
	n       int64
	sum     uint64
	changed bool // a body differed from the reference

	made    int           // bodies handed out, the next one's number
	open    []int         // the numbers of those not yet closed
	wake    chan struct{} // closed when the reference is set or a body closes
	waiting int           // later bodies waiting (await), for tests
}

// bodyWaitLimit bounds how long a later body waits for an earlier one to
// be closed or to make the reference. net/http's HTTP/1.1 Transport waits
// 50 ms for a request still being written before it closes the
// connection (and the body) under a response that came first.
const bodyWaitLimit = 250 * time.Millisecond

// handOut numbers a new body and counts it open.
func (r *bodyRef) handOut() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.made
	r.made++
	r.open = append(r.open, k)
	return k
}

// closed records that body k is closed.
func (r *bodyRef) closed(k int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, o := range r.open {
		if o == k {
			r.open = append(r.open[:i], r.open[i+1:]...)
			r.wakeLocked()
			return
		}
	}
}

func (r *bodyRef) wakeLocked() {
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
}

// await waits, for body k, until the reference is known (it returns its
// length and true) or no body before k is open (false: k is to be the
// reference), or ctx ends.
func (r *bodyRef) await(ctx context.Context, k int) (int64, bool, error) {
	var limit <-chan time.Time
	for {
		r.mu.Lock()
		if r.set {
			n := r.n
			r.mu.Unlock()
			return n, true, nil
		}
		earlier := false
		for _, o := range r.open {
			earlier = earlier || o < k
		}
		if !earlier {
			r.mu.Unlock()
			return 0, false, nil
		}
		if r.wake == nil {
			r.wake = make(chan struct{})
		}
		wake := r.wake
		r.waiting++
		r.mu.Unlock()
		if limit == nil {
			t := time.NewTimer(bodyWaitLimit)
			defer t.Stop()
			limit = t.C
		}
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		case <-limit:
			err = fmt.Errorf("idemhttp: a body an earlier attempt was sending was not closed within %s: this one cannot be checked against it, and is not sent", bodyWaitLimit)
		}
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
		if err != nil {
			return 0, false, err
		}
	}
}

// waiters returns how many later bodies wait for an earlier one.
func (r *bodyRef) waiters() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waiting
}

// done records a body of n bytes whose hash is sum, read to its end (or
// to its declared length), and reports whether it matches the reference
// (the first such body is the reference).
func (r *bodyRef) done(n int64, sum uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.set {
		r.set, r.n, r.sum = true, n, sum
		r.wakeLocked()
		return true
	}
	if r.n == n && r.sum == sum {
		return true
	}
	r.changed = true
	return false
}

func (r *bodyRef) differed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// mismatch records a body that differed before its end.
func (r *bodyRef) mismatch() {
	r.mu.Lock()
	r.changed = true
	r.mu.Unlock()
}

// verifyingBody hashes a streamed body as it is read. A reference body
// (the first, or a later one that found no reference and no earlier body
// open) records the reference; a checked body holds back byte number n of
// the reference (n its length), and fails at once when more than n bytes
// arrive: its last byte goes out only once the whole body is known to be
// the reference.
type verifyingBody struct {
	src      io.ReadCloser
	ref      *bodyRef
	ctx      context.Context // a later body's: bounds its wait for earlier ones
	k        int             // its number (bodyRef.handOut)
	later    bool            // from GetBody: its mode is decided at its first Read
	declared int64           // the request's declared length, 0 if unknown
	check    bool
	n        int64 // the reference's length, with check

	h        maphash.Hash
	read     int64 // bytes read from src
	recorded bool  // a reference body recorded the reference
	held     byte  // byte n, held back
	hasHeld  bool
	eof      bool
	err      error

	// Close may come from another goroutine than Read's (net/http's
	// Client closes a request's body as it follows a redirect, while its
	// Transport may still be writing it): once closed, no byte goes out,
	// and a reference body records the reference, or not, before it is
	// counted closed, never after.
	mu       sync.Mutex
	isClosed bool
}

// errBodyClosed is what a body read after its Close returns.
var errBodyClosed = errors.New("idemhttp: request body read after it was closed")

// reset makes v the next body of ref, reading src. declared is the
// request's Content-Length (0 or less if unknown); later is set for every
// body but the caller's own, and ctx bounds its wait.
func (v *verifyingBody) reset(ctx context.Context, src io.ReadCloser, ref *bodyRef, declared int64, later bool) {
	*v = verifyingBody{src: src, ref: ref, ctx: ctx, later: later, declared: max(declared, 0)}
	v.k = ref.handOut()
	v.h.SetSeed(bodySeed)
}

func (v *verifyingBody) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if v.closedNow() {
		return 0, errBodyClosed
	}
	if v.later {
		v.later = false
		n, ok, err := v.ref.await(v.ctx, v.k)
		if err != nil {
			v.err = err
			return 0, err
		}
		v.n, v.check = n, ok
	}
	if !v.check {
		return v.readReference(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if v.eof {
			// Verified: release the held byte, then EOF.
			if v.hasHeld {
				p[0], v.hasHeld = v.held, false
				return 1, io.EOF
			}
			return 0, io.EOF
		}
		n, err := v.src.Read(p)
		v.h.Write(p[:n])
		v.read += int64(n)
		if v.read > v.n {
			// Longer than the reference: byte n is already held, and
			// nothing past it may go out.
			return v.fail()
		}
		out := n
		if v.read == v.n && n > 0 {
			// This read holds byte n: keep it back.
			v.held, v.hasHeld = p[n-1], true
			out = n - 1
		}
		switch {
		case err == io.EOF:
			if v.read != v.n || !v.ref.done(v.read, v.h.Sum64()) {
				return v.fail()
			}
			v.eof = true
			if out > 0 {
				return out, nil
			}
		case err != nil:
			v.err = err
			return out, err
		case out > 0:
			return out, nil
		case n == 0:
			return 0, nil
		}
	}
}

// readReference reads a reference body: it records the reference once
// the declared length is read (the server has the body whole then), or
// at its end when no length was declared. Bytes past the declared length
// are no part of it: net/http refuses to send them, and says so.
func (v *verifyingBody) readReference(p []byte) (int, error) {
	n, err := v.src.Read(p)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.isClosed {
		return 0, errBodyClosed // closed while reading: these bytes stay here
	}
	take := int64(n)
	if v.declared > 0 {
		take = min(take, max(v.declared-v.read, 0))
	}
	v.h.Write(p[:take])
	v.read += int64(n)
	if !v.recorded {
		switch {
		case v.declared > 0 && v.read >= v.declared:
			v.recorded = true
			v.ref.done(v.declared, v.h.Sum64())
		case v.declared == 0 && err == io.EOF:
			v.recorded = true
			v.ref.done(v.read, v.h.Sum64())
		}
	}
	return n, err
}

// fail stops the body: it differs from the reference.
func (v *verifyingBody) fail() (int, error) {
	v.ref.mismatch()
	v.err = ErrBodyChanged
	return 0, v.err
}

// Close closes the source, and tells the reference that this body can
// no longer reach the server whole, the first time it is called.
func (v *verifyingBody) Close() error {
	v.mu.Lock()
	first := !v.isClosed
	v.isClosed = true
	v.mu.Unlock()
	if !first {
		// Closed already (by the call unwinding a panic, or by
		// net/http's Client following a redirect): the caller's body is
		// closed once, as net/http closes a request's body once.
		return nil
	}
	v.ref.closed(v.k)
	return v.src.Close()
}

// closeIfOpen closes v unless it is closed already (by the transport).
func (v *verifyingBody) closeIfOpen() {
	v.mu.Lock()
	first := !v.isClosed
	v.isClosed = true
	v.mu.Unlock()
	if first {
		v.ref.closed(v.k)
		_ = v.src.Close()
	}
}

func (v *verifyingBody) closedNow() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.isClosed
}

// memBody is the engine's ReaderFunc for a body in memory: every attempt
// reads the same bytes. The first attempt's reader lives in the call
// state; later ones are new, since net/http may still be reading the
// previous one when the next attempt starts. A *bytes.Reader or a
// *strings.Reader, wrapped in io.NopCloser: net/http writes such a body
// with the request head, in one write.
func (a *operation) memBody() (io.Reader, error) {
	if a.probing {
		return http.NoBody, nil // retryEngine sets ContentLength from the buffer
	}
	if !a.memUsed {
		a.memUsed = true
		if a.mem.str {
			a.strReader.Reset(a.mem.s)
			return &a.strReader, nil
		}
		a.memReader.Reset(a.mem.b)
		return &a.memReader, nil
	}
	if plant.GetBodyRewind { // a planted bug (internal/plant)
		if gb, ok := plantGetBodies.Load(a); ok {
			if rc, err := gb.(func() (io.ReadCloser, error))(); err == nil {
				return rc, nil
			}
		}
	}
	if a.mem.str {
		return strings.NewReader(a.mem.s), nil
	}
	return bytes.NewReader(a.mem.b), nil
}

// plantGetBodies holds each call's GetBody in a build with the planted
// bug plant.GetBodyRewind; empty in every other.
var plantGetBodies sync.Map

// rewind is the outgoing request's GetBody, for net/http's own resends
// (a dead pooled connection) and for its redirects: a body as the next
// attempt would send it, as the engine's own GetBody returns it.
func (a *operation) rewind() (io.ReadCloser, error) {
	var r io.Reader
	var err error
	if a.mem.len() > 0 {
		r, err = a.memBody()
	} else {
		r, err = a.body()
	}
	if err != nil {
		return nil, err
	}
	if rc, ok := r.(io.ReadCloser); ok {
		return rc, nil
	}
	return io.NopCloser(r), nil
}

// streamed is the state of a streamed body, made only for one (the call
// state would grow by a third for every call otherwise): the first
// attempt sends the caller's Body (first, hashed as it goes, the
// reference); later ones (and net/http's own rewinds for redirects and
// dead pooled connections, through GetBody) a fresh copy from getBody,
// checked against the reference.
type streamed struct {
	first   verifyingBody
	ref     bodyRef
	getBody func() (io.ReadCloser, error)
	// handFirst: the engine sends the first attempt too (config.engineFirst,
	// for tests): its first rewind hands over first.
	handFirst bool
	// last is the latest body from getBody: the engine makes an attempt's
	// body before its hooks run (Pacer.Wait, OnAttempt), so a panic there
	// leaves it unsent, and only the call can close it.
	last *verifyingBody
}

// body is the engine's ReaderFunc for a streamed request: a body from
// GetBody, checked against the reference (see streamed).
func (a *operation) body() (io.Reader, error) {
	if a.probing {
		return http.NoBody, nil // retryEngine sets ContentLength from the request
	}
	if st := a.stream; st.handFirst {
		st.handFirst = false
		return &st.first, nil
	}
	rc, err := a.stream.getBody()
	if err != nil {
		return nil, a.giveUpJoin(ErrNotReplayable, err, nil)
	}
	if rc == nil {
		rc = http.NoBody
	}
	v := &verifyingBody{}
	v.reset(a.req.Context(), rc, &a.stream.ref, a.bodyLen, true)
	a.stream.last = v
	return v, nil
}
