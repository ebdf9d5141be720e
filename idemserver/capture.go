package idemserver

import (
	"bufio"
	"net"
	"net/http"
	"slices"
	"strconv"

	"github.com/idemkit/idemhttp/internal/plant"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// recorder passes a handler's response through to the client while writing
// the record a replay needs: the head (status and header, encoded when the
// header is sent) followed by the body as it is written, up to a limit.
// Passing through, rather than buffering and sending at the end, keeps the
// handler's streaming and flushing behaviour intact; encoding at once,
// rather than cloning the header, saves the copy a store would make anyway.
type recorder struct {
	rw          http.ResponseWriter
	keep        *handler    // its keepHeader says which header fields to record
	outer       http.Header // fields set before the handler ran, not recorded
	record      []byte      // head, then body; nil once the body overflows
	bodyStart   int         // where the body starts in record
	limit       int         // most body bytes kept
	status      int         // final status, 0 until the header is sent
	overflow    bool        // the body exceeded limit: not storable
	hijacked    bool        // the handler took the connection, or answered 101: not replayable
	wroteHeader bool
	renewal     renewal // keeps the claim while the handler runs
}

// maxHint bounds the body buffer reserved from a declared Content-Length.
const maxHint = 1 << 20

var (
	_ http.ResponseWriter = (*recorder)(nil)
	_ http.Flusher        = (*recorder)(nil)
	_ http.Hijacker       = (*recorder)(nil)
)

func (c *recorder) Header() http.Header { return c.rw.Header() }

func (c *recorder) WriteHeader(code int) {
	if c.wroteHeader {
		c.rw.WriteHeader(code) // let net/http report the superfluous call
		return
	}
	// 1xx informational responses (103 Early Hints) precede the final one.
	// 101 Switching Protocols is final, as net/http treats it, and ends
	// HTTP on the connection, like a hijack: what follows is not HTTP a
	// replay could send.
	if code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols {
		c.rw.WriteHeader(code)
		return
	}
	c.hijacked = c.hijacked || code == http.StatusSwitchingProtocols
	c.snapshot(code)
	c.rw.WriteHeader(code)
}

// snapshot records the final status and the header as net/http sends it
// (later changes to the header map are not sent, so not recorded either).
func (c *recorder) snapshot(code int) {
	c.wroteHeader = true
	c.status = code
	if code < 100 || code > 999 {
		return // net/http panics on it; the panic releases the key
	}
	h := c.rw.Header()
	hint := 0                                  // unknown: let append size it, and takeRecord trim it
	if v := h.Get("Content-Length"); v != "" { // Atoi's error for "" costs an allocation
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			hint = n
		}
	}
	// The declared length sizes the buffer, within the limit and never
	// past maxHint: a handler may declare more than it sends.
	c.record = servercore.EncodeHead(code, h, min(hint, c.limit, maxHint), c.recorded)
	c.bodyStart = len(c.record)
}

// recorded reports whether the header field name, with values vs, goes in
// the record: not hop-by-hop, chosen by keep, and set by the handler rather
// than left as outer middleware set it.
//
// The rules compare canonical names: a handler may write a field under
// any spelling (w.Header()["set-cookie"]), and net/http sends it as it is
// spelt, which a client reads as the same field.
func (c *recorder) recorded(name string, vs []string) bool {
	canon := http.CanonicalHeaderKey(name) // no allocation when name is canonical
	if slices.Contains(servercore.HopHeaders, canon) || !c.keep.keepHeader(canon) {
		return false
	}
	if c.outer != nil {
		if before, ok := c.outer[name]; ok && slices.Equal(before, vs) {
			return false
		}
	}
	return true
}

func (c *recorder) Write(p []byte) (int, error) {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	if !c.overflow {
		if len(c.record)-c.bodyStart+len(p) > c.limit {
			c.overflow = true
			c.record = nil
		} else {
			c.record = append(c.record, p...)
		}
	}
	return c.rw.Write(p)
}

// finish completes the record once the handler has returned: a handler that
// wrote nothing sends 200 with the header it set, as net/http does.
func (c *recorder) finish() {
	if !c.wroteHeader {
		c.snapshot(http.StatusOK)
	}
}

// takeRecord returns the finished record for a store to keep, trimmed of
// growth slack worth copying to be rid of: it may be kept for a day.
func (c *recorder) takeRecord() []byte {
	if cap(c.record)-len(c.record) > len(c.record)/4 {
		return slices.Clone(c.record)
	}
	return c.record
}

// Flush sends what the handler wrote so far, when the connection supports it.
func (c *recorder) Flush() {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	_ = http.NewResponseController(c.rw).Flush() // http.Flusher has no error to report
}

// Hijack hands the connection to the handler. What it sends then bypasses
// the recorder, so the response cannot be replayed; since the handler ran,
// its key is kept as completed, not replayable.
func (c *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(c.rw).Hijack()
	if err == nil && !plant.HijackStored {
		c.hijacked = true
	}
	return conn, rw, err
}

// Unwrap lets [http.ResponseController] reach the connection's other
// controls (deadlines, full duplex).
func (c *recorder) Unwrap() http.ResponseWriter { return c.rw }
