package idemhttp

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"sync"
)

// This file makes "byte-identical on every attempt" hold for every body.
//
// A body of known length up to MaxBodyBytes, and any body a journal must
// store, is read into memory once, before the first attempt, and every
// attempt sends that buffer: identical by construction, whatever GetBody
// would have returned and whatever the caller did to req.Body after
// NewRequest. (net/http writes an in-memory body together with the
// request head, in one write.) That costs one copy of the body; the fast
// path that sent req.Body itself when its GetBody looked like
// http.NewRequest's (recognised by the closure's code pointer) is gone:
// it broke when the caller swapped req.Body, and it reached into
// net/http's internals (BenchmarkDoInterleaved, bench/README.md).
//
// A larger body, or one of unknown length, with GetBody is streamed: the
// first attempt sends req.Body and sets the reference (its length n and a
// seeded maphash of its bytes), and every later body, from GetBody, is
// checked against it as it goes out. It holds back byte n of the
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
// maxBody; then req.Body is read and closed. Otherwise it returns the
// request's GetBody, and req.Body stays open: the first attempt streams
// it, as net/http would.
func replayableBody(req *http.Request, needBytes bool, maxBody int64) ([]byte, func() (io.ReadCloser, error), error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil, nil
	}
	if req.GetBody != nil && !needBytes && (req.ContentLength <= 0 || req.ContentLength > maxBody) {
		return nil, req.GetBody, nil
	}
	defer closeBody(req)
	// Sized from Content-Length (+1 so reaching EOF needs no growth):
	// bytes.Buffer.ReadFrom would double a 1 KiB buffer to keep 512 bytes
	// free, for every request.
	size := 512
	if req.ContentLength > 0 && req.ContentLength <= maxBody {
		size = int(req.ContentLength) + 1
	}
	buf := make([]byte, 0, size)
	r := io.LimitReader(req.Body, maxBody+1)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("idemhttp: %w: read body: %w", ErrInvalidRequest, err)
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
	}
	if int64(len(buf)) > maxBody {
		return nil, nil, fmt.Errorf("idemhttp: %w: body larger than MaxBodyBytes (%d)", ErrNotReplayable, maxBody)
	}
	if len(buf) == 0 {
		return nil, nil, nil
	}
	return buf, nil, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// bodyRef is the reference a call's streamed bodies are compared with.
// Bodies are read by net/http's write loop, which may still run after
// RoundTrip returned, so it is guarded by a mutex.
type bodyRef struct {
	mu      sync.Mutex
	set     bool
	n       int64
	sum     uint64
	changed bool // a body differed from the reference
}

// done records a body read to its end and reports whether it matches the
// reference (the first such body is the reference).
func (r *bodyRef) done(n int64, sum uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.set {
		r.set, r.n, r.sum = true, n, sum
		return true
	}
	if r.n == n && r.sum == sum {
		return true
	}
	r.changed = true
	return false
}

// length returns the reference's length, and whether it is set.
func (r *bodyRef) length() (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.set
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

// verifyingBody hashes a streamed body as it is read. With check set it
// holds back byte number n of the reference (n its length), and fails at
// once when more than n bytes arrive: the body's last byte goes out only
// once the whole body is known to be the reference.
type verifyingBody struct {
	src   io.ReadCloser
	ref   *bodyRef
	check bool
	n     int64 // the reference's length, with check

	h       maphash.Hash
	read    int64 // bytes read from src
	held    byte  // byte n, held back
	hasHeld bool
	eof     bool
	err     error
}

func (v *verifyingBody) reset(src io.ReadCloser, ref *bodyRef) {
	*v = verifyingBody{src: src, ref: ref}
	v.n, v.check = ref.length()
	v.h.SetSeed(bodySeed)
}

func (v *verifyingBody) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if !v.check {
		n, err := v.src.Read(p)
		v.h.Write(p[:n])
		v.read += int64(n)
		if err == io.EOF {
			v.ref.done(v.read, v.h.Sum64())
		}
		return n, err
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

// fail stops the body: it differs from the reference.
func (v *verifyingBody) fail() (int, error) {
	v.ref.mismatch()
	v.err = ErrBodyChanged
	return 0, v.err
}

func (v *verifyingBody) Close() error { return v.src.Close() }

// memBody is the engine's ReaderFunc for a body in memory: every attempt
// reads the same bytes. The first attempt's reader lives in the call
// state; later ones are new, since net/http may still be reading the
// previous one when the engine starts the next attempt. A *bytes.Reader,
// which the engine wraps in io.NopCloser: net/http writes such a body
// with the request head, in one write.
func (a *operation) memBody() (io.Reader, error) {
	if a.probing {
		return http.NoBody, nil // Do sets ContentLength from the buffer
	}
	if !a.memUsed {
		a.memUsed = true
		a.memReader.Reset(a.mem)
		return &a.memReader, nil
	}
	return bytes.NewReader(a.mem), nil
}

// body is the engine's ReaderFunc for a streamed request: the first
// attempt sends the caller's Body (hashed as it goes, the reference),
// later ones (and net/http's own rewinds for redirects and dead pooled
// connections, through the engine's GetBody) a fresh copy from GetBody,
// checked against the reference.
func (a *operation) body() (io.Reader, error) {
	if a.probing {
		return http.NoBody, nil // Do sets ContentLength from the request
	}
	if b := a.firstBody; b != nil {
		a.firstBody = nil
		return b, nil
	}
	rc, err := a.getBody()
	if err != nil {
		return nil, a.giveUpJoin(ErrNotReplayable, err, nil)
	}
	if rc == nil {
		rc = http.NoBody
	}
	v := &verifyingBody{}
	v.reset(rc, &a.bodyRef)
	return v, nil
}
