package idemhttp

import (
	"bytes"
	"hash/maphash"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
)

// This file makes "byte-identical on every attempt" a checked fact for
// bodies that come from the caller's GetBody. A buffered body is identical
// by construction; a GetBody is the caller's code and may return other
// bytes on a retry (a reader over a buffer that was reused, a file that
// changed). The first body read to its end sets the reference (its length
// and a seeded maphash of its bytes); every later one is compared with it
// and holds back its last byte until the comparison passed, so a body that
// differs is never completely sent: the server sees a truncated request,
// which it cannot act on, and the call stops with ErrBodyChanged.
//
// maphash rather than SHA-256: the threat is a buggy GetBody, not an
// adversary, and the seed is random per process, so a collision cannot be
// crafted; it hashes at memory speed and allocates nothing, which matters
// because the first attempt of every call with a GetBody pays for it.

// The first attempt of a body that http.NewRequest made replayable (a
// bytes.Reader, strings.Reader or bytes.Buffer, wrapped in io.NopCloser) is
// hashed in place, without reading it, and sent as it is: net/http writes
// such a body together with the request head, in one write, while any
// other reader makes it flush the head first and copy the body through a
// 32 KiB buffer. Only a body of another type is wrapped to be hashed as it
// is read.

// bodySeed seeds every body hash of this process.
var bodySeed = maphash.MakeSeed()

// bodyRef is the reference a call's bodies are compared with. Bodies are
// read by net/http's write loop, which may still run after RoundTrip
// returned, so it is guarded by a mutex.
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

func (r *bodyRef) known() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.set
}

func (r *bodyRef) differed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// verifyingBody hashes a request body as it is read. With check set it
// holds back the last byte until the whole body was compared with the
// reference.
type verifyingBody struct {
	src   io.ReadCloser
	ref   *bodyRef
	check bool

	h       maphash.Hash
	n       int64
	held    byte
	hasHeld bool
	eof     bool
	err     error
}

func (v *verifyingBody) reset(src io.ReadCloser, ref *bodyRef, check bool) {
	*v = verifyingBody{src: src, ref: ref, check: check}
	v.h.SetSeed(bodySeed)
}

func (v *verifyingBody) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	if !v.check {
		n, err := v.src.Read(p)
		v.h.Write(p[:n])
		v.n += int64(n)
		if err == io.EOF {
			v.ref.done(v.n, v.h.Sum64())
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
		v.n += int64(n)
		out := 0
		if n > 0 {
			last := p[n-1]
			if v.hasHeld {
				copy(p[1:n], p[:n-1])
				p[0] = v.held
				out = n
			} else {
				out = n - 1
			}
			v.held, v.hasHeld = last, true
		}
		switch {
		case err == io.EOF:
			if !v.ref.done(v.n, v.h.Sum64()) {
				v.err = ErrBodyChanged
				return 0, v.err
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

func (v *verifyingBody) Close() error { return v.src.Close() }

// netHTTPGetBody holds the code pointers of the GetBody functions that
// http.NewRequest installs for a bytes.Buffer, a bytes.Reader and a
// strings.Reader: each returns a new reader over a snapshot of the bytes
// the request was made with, so a retry's body is the first attempt's by
// construction, and needs neither a hash nor a check. A GetBody of any
// other origin (the caller's own, or one these pointers do not recognise
// in some future Go) gets the hash and the check.
var netHTTPGetBody = func() (ptrs [3]uintptr) {
	for i, b := range []io.Reader{bytes.NewBufferString("x"), bytes.NewReader([]byte("x")), strings.NewReader("x")} {
		if r, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/", b); err == nil && r.GetBody != nil {
			ptrs[i] = reflect.ValueOf(r.GetBody).Pointer()
		}
	}
	return ptrs
}()

// trustedBody reports whether req's GetBody is the one http.NewRequest
// made for mem, req's in-memory body (from inMemory), and the body is
// still whole (nothing read from it since, nothing appended), so that
// GetBody returns exactly the bytes the first attempt sends.
func trustedBody(req *http.Request, mem io.Reader) bool {
	p := reflect.ValueOf(req.GetBody).Pointer()
	if p == 0 || (p != netHTTPGetBody[0] && p != netHTTPGetBody[1] && p != netHTTPGetBody[2]) {
		return false
	}
	l, ok := mem.(interface{ Len() int }) // all three in-memory readers
	return ok && int64(l.Len()) == req.ContentLength
}

// nopCloserTypes are the types io.NopCloser returns, which net/http looks
// through in the same way to find an in-memory body.
var nopCloserTypes = [...]reflect.Type{
	reflect.TypeOf(io.NopCloser(nil)),
	reflect.TypeOf(io.NopCloser(bytes.NewReader(nil))),
}

// inMemory returns the in-memory reader under body (itself, or inside
// io.NopCloser), or nil if body is of any other kind.
func inMemory(body io.Reader) io.Reader {
	r := body
	if t := reflect.TypeOf(body); t == nopCloserTypes[0] || t == nopCloserTypes[1] {
		r, _ = reflect.ValueOf(body).Field(0).Interface().(io.Reader)
	}
	switch r.(type) {
	case *bytes.Reader, *strings.Reader, *bytes.Buffer:
		return r
	}
	return nil
}

// hashInMemory hashes the unread bytes of an in-memory reader without
// reading them, and returns their length and hash.
func hashInMemory(r io.Reader) (int64, uint64) {
	var h maphash.Hash
	h.SetSeed(bodySeed)
	var buf [512]byte
	hashAt := func(ra io.ReaderAt, off, size int64) int64 {
		n := int64(0)
		for off < size {
			k, _ := ra.ReadAt(buf[:], off)
			if k == 0 {
				break
			}
			h.Write(buf[:k])
			off += int64(k)
			n += int64(k)
		}
		return n
	}
	var n int64
	switch r := r.(type) {
	case *bytes.Buffer:
		h.Write(r.Bytes())
		n = int64(r.Len())
	case *bytes.Reader:
		n = hashAt(r, r.Size()-int64(r.Len()), r.Size())
	case *strings.Reader:
		n = hashAt(r, r.Size()-int64(r.Len()), r.Size())
	}
	return n, h.Sum64()
}

// body is the engine's ReaderFunc for a request with GetBody: the first
// attempt sends the caller's Body, later ones (and net/http's own rewinds
// for redirects and dead pooled connections, through the engine's GetBody)
// a fresh copy from GetBody, checked against the first.
func (a *attempt) body() (io.Reader, error) {
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
	if a.trusted {
		return rc, nil
	}
	if rc == nil || rc == http.NoBody {
		rc = http.NoBody
	}
	v := &verifyingBody{}
	v.reset(rc, &a.bodyRef, a.bodyRef.known())
	return v, nil
}
