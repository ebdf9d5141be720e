//go:build go1.26

package sim

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The simulated network: in-memory connections between the client's
// http.Transport (its DialContext) and the server's http.Server (its
// Listener), so that net/http's own code runs on both sides, and its
// httptrace events are the client's evidence. Nothing moves by itself:
// a dial waits until the driver accepts or refuses it, and the bytes a
// side writes wait, as whole messages (a request, a response, the end of
// a side), until the driver delivers, delays, drops or resets them. What
// a receiver does with them then runs to quiescence before the driver's
// next step, which is what keeps a run the same for a seed.

// connID names a connection the same way on every run: the client
// process that dialed it, the host (one per operation, so that each
// operation has a connection pool of its own and no two operations
// share a connection) and the number of the dial to that host.
type connID struct {
	proc   int
	client int // which of the process's Clients (each has a pool of its own)
	host   string
	n      int
}

func (id connID) String() string {
	c := ""
	if id.client > 0 {
		c = "." + strconv.Itoa(id.client)
	}
	return "c" + strconv.Itoa(id.proc) + c + "/" + id.host + "#" + strconv.Itoa(id.n)
}

func (id connID) less(o connID) int {
	switch {
	case id.proc != o.proc:
		return id.proc - o.proc
	case id.client != o.client:
		return id.client - o.client
	case id.host != o.host:
		if id.host < o.host {
			return -1
		}
		return 1
	}
	return id.n - o.n
}

// msgKind is what a message carries.
type msgKind int

const (
	msgRequest  msgKind = iota + 1 // client to server: one whole request
	msgResponse                    // server to client: one whole response
	msgFin                         // the sender closed its side: the receiver reads EOF after what came before
	msgReset                       // the server's process died: the client's reads fail with ECONNRESET
)

func (k msgKind) String() string {
	return [...]string{"", "request", "response", "fin", "reset"}[k]
}

// message is what one side wrote and the other has not been given yet.
type message struct {
	conn      *conn
	up        bool // client to server
	seq       int  // in its conn and direction
	kind      msgKind
	data      []byte
	key       string // a request's Idempotency-Key
	status    int    // a response's status
	replayed  bool   // a response's Idempotent-Replayed
	notBefore time.Time
	delayed   bool // held back once already
}

func (m *message) String() string {
	dir := "down"
	if m.up {
		dir = "up"
	}
	s := m.conn.id.String() + " " + dir + "#" + strconv.Itoa(m.seq) + " " + m.kind.String()
	switch m.kind {
	case msgRequest:
		s += " key=" + m.key
	case msgResponse:
		s += " " + strconv.Itoa(m.status)
		if m.replayed {
			s += " replayed"
		}
	}
	return s
}

// pendingDial is a dial waiting for the driver.
type pendingDial struct {
	id  connID
	res chan dialResult
}

type dialResult struct {
	c   net.Conn
	err error
}

// network holds every connection and message of a world.
type network struct {
	w  *world
	mu sync.Mutex
	// dials: waiting for the driver; msgs: every message not yet
	// delivered or discarded, in no particular order (the driver sorts).
	dials []*pendingDial
	msgs  []*message
	conns []*conn           // every connection ever made
	seqs  map[string]int    // dials so far per process and host
	ln    map[int]*listener // the listener of each server process
	ups   []int             // the server processes that accept, behind one address
}

func newNetwork(w *world) *network {
	return &network{w: w, seqs: map[string]int{}, ln: map[int]*listener{}}
}

// errRefused is a dial's error when the driver refuses it, or when no
// server listens: what a connection refused looks like to net/http.
func errRefused(addr string) error {
	return &net.OpError{Op: "dial", Net: "tcp", Addr: simAddr(addr), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
}

func errReset(op string) error {
	return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, syscall.ECONNRESET)}
}

// dial is the DialContext of client process proc's Transport. It waits
// for the driver's decision.
func (n *network) dial(ctx context.Context, p *clientProc, client int, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	n.mu.Lock()
	if p.dead.Load() {
		n.mu.Unlock()
		return nil, errRefused(addr)
	}
	k := fmt.Sprintf("%d.%d/%s", p.n, client, host)
	n.seqs[k]++
	d := &pendingDial{id: connID{proc: p.n, client: client, host: host, n: n.seqs[k]}, res: make(chan dialResult, 1)}
	n.dials = append(n.dials, d)
	n.mu.Unlock()
	select {
	case r := <-d.res:
		return r.c, r.err
	case <-ctx.Done():
		n.mu.Lock()
		n.dials = slices.DeleteFunc(n.dials, func(x *pendingDial) bool { return x == d })
		n.mu.Unlock()
		select {
		case r := <-d.res: // resolved meanwhile: the driver's word stands
			if r.c != nil {
				_ = r.c.Close()
			}
		default:
		}
		return nil, ctx.Err()
	}
}

// readyDials returns the dials waiting, in a deterministic order.
func (n *network) readyDials() []*pendingDial {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := slices.Clone(n.dials)
	slices.SortFunc(out, func(a, b *pendingDial) int { return a.id.less(b.id) })
	return out
}

// resolve answers a waiting dial: a connection to server process srv, or
// refused (srv 0).
func (n *network) resolve(d *pendingDial, srv int) {
	n.mu.Lock()
	n.dials = slices.DeleteFunc(n.dials, func(x *pendingDial) bool { return x == d })
	ln := n.ln[srv]
	if srv == 0 || ln == nil || ln.isClosed() {
		n.mu.Unlock()
		d.res <- dialResult{err: errRefused(d.id.host + ":80")}
		return
	}
	c := &conn{net: n, id: d.id, server: srv}
	c.client = &end{c: c, client: true, in: newWire()}
	c.serverEnd = &end{c: c, in: newWire()}
	n.conns = append(n.conns, c)
	n.mu.Unlock()
	ln.push(c.serverEnd)
	d.res <- dialResult{c: c.client}
}

// readyMsgs returns the messages the driver may deliver now: the first of
// each connection and direction, due, in a deterministic order.
func (n *network) readyMsgs(now time.Time) []*message {
	n.mu.Lock()
	defer n.mu.Unlock()
	heads := map[*conn][2]*message{}
	for _, m := range n.msgs {
		i := 0
		if m.up {
			i = 1
		}
		h := heads[m.conn]
		if h[i] == nil || m.seq < h[i].seq {
			h[i] = m
			heads[m.conn] = h
		}
	}
	var out []*message
	for _, h := range heads {
		for _, m := range h {
			if m != nil && !m.notBefore.After(now) {
				out = append(out, m)
			}
		}
	}
	slices.SortFunc(out, func(a, b *message) int {
		if c := a.conn.id.less(b.conn.id); c != 0 {
			return c
		}
		if a.up != b.up {
			if a.up {
				return -1
			}
			return 1
		}
		return a.seq - b.seq
	})
	return out
}

// nextDue returns the earliest time a message waiting for its delay
// becomes deliverable, zero if none waits.
func (n *network) nextDue(now time.Time) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	var t time.Time
	for _, m := range n.msgs {
		if m.notBefore.After(now) && (t.IsZero() || m.notBefore.Before(t)) {
			t = m.notBefore
		}
	}
	return t
}

// take removes m from the messages not yet delivered.
func (n *network) takeLocked(m *message) {
	n.msgs = slices.DeleteFunc(n.msgs, func(x *message) bool { return x == m })
}

// deliver hands m to its receiver.
func (n *network) deliver(m *message) {
	n.mu.Lock()
	n.takeLocked(m)
	c := m.conn
	n.mu.Unlock()
	to := c.serverEnd
	if !m.up {
		to = c.client
	}
	switch m.kind {
	case msgFin:
		to.in.finish()
	case msgReset:
		c.mu.Lock()
		c.broken = true
		c.mu.Unlock()
		to.in.fail(errReset("read"))
	default:
		to.in.put(m.data)
	}
	if m.up && m.kind == msgRequest {
		c.mu.Lock()
		c.requests++
		c.mu.Unlock()
		n.w.requests++
	}
	if !m.up && m.kind == msgResponse {
		c.mu.Lock()
		c.responses++
		c.mu.Unlock()
	}
}

// drop discards m: it never arrives.
func (n *network) drop(m *message) {
	n.mu.Lock()
	n.takeLocked(m)
	n.mu.Unlock()
}

// delay holds m back until t.
func (n *network) delay(m *message, t time.Time) {
	n.mu.Lock()
	m.notBefore = t
	n.mu.Unlock()
}

// reset breaks c in both directions: reads and writes fail with
// ECONNRESET, and what was on its way is lost.
func (n *network) reset(c *conn) {
	c.mu.Lock()
	c.broken = true // first: queue drops what comes after (see queue)
	c.mu.Unlock()
	n.mu.Lock()
	n.msgs = slices.DeleteFunc(n.msgs, func(x *message) bool { return x.conn == c })
	n.mu.Unlock()
	c.client.in.fail(errReset("read"))
	c.serverEnd.in.fail(errReset("read"))
}

// eofInsteadOf ends c's response direction where m would have gone: the
// client reads EOF instead of m (a connection the server closed while the
// client's request was on its way), and the server's side is closed.
func (n *network) eofInsteadOf(m *message) {
	m.conn.mu.Lock()
	m.conn.broken = true // first: queue drops what comes after (see queue)
	m.conn.mu.Unlock()
	n.mu.Lock()
	n.msgs = slices.DeleteFunc(n.msgs, func(x *message) bool { return x.conn == m.conn })
	n.mu.Unlock()
	m.conn.client.in.finish()
	m.conn.serverEnd.in.fail(net.ErrClosed)
}

// killProc breaks every connection of client process p at once: the
// process is gone, and so are its sockets.
func (n *network) killProc(p int) {
	n.mu.Lock()
	var cs []*conn
	for _, c := range n.conns {
		if c.id.proc == p {
			cs = append(cs, c)
		}
	}
	dials := slices.Clone(n.dials)
	n.dials = slices.DeleteFunc(n.dials, func(d *pendingDial) bool { return d.id.proc == p })
	n.mu.Unlock()
	for _, d := range dials {
		if d.id.proc == p {
			d.res <- dialResult{err: errRefused(d.id.host + ":80")}
		}
	}
	for _, c := range cs {
		n.reset(c)
	}
}

// serverDown stops server process s accepting, and ends its side of
// every connection at once; the client learns of it when the driver
// delivers the reset that takes the place of everything its side had on
// its way (one connection at a time, as every event the client sees).
func (n *network) serverDown(s int) {
	n.mu.Lock()
	ln := n.ln[s]
	n.ups = slices.DeleteFunc(n.ups, func(x int) bool { return x == s })
	var cs []*conn
	for _, c := range n.conns {
		if c.server == s {
			cs = append(cs, c)
		}
	}
	n.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for _, c := range cs {
		c.mu.Lock()
		gone := c.broken || c.serverGone
		c.serverGone = true
		c.mu.Unlock()
		if gone {
			continue
		}
		n.mu.Lock()
		n.msgs = slices.DeleteFunc(n.msgs, func(x *message) bool { return x.conn == c })
		n.mu.Unlock()
		n.queue(c, false, msgReset, nil, "", 0, false)
		c.serverEnd.in.fail(net.ErrClosed)
	}
}

// idleConns returns the connections open on both sides with nothing on
// their way: a pooled connection the server may close.
func (n *network) idleConns() []*conn {
	n.mu.Lock()
	busy := map[*conn]bool{}
	for _, m := range n.msgs {
		busy[m.conn] = true
	}
	cs := slices.Clone(n.conns)
	n.mu.Unlock()
	var out []*conn
	for _, c := range cs {
		c.mu.Lock()
		idle := !c.broken && !c.serverGone && c.requests > 0 && c.requests == c.responses && !busy[c]
		c.mu.Unlock()
		c.client.mu.Lock()
		idle = idle && !c.client.closed
		c.client.mu.Unlock()
		c.serverEnd.mu.Lock()
		idle = idle && !c.serverEnd.closed
		c.serverEnd.mu.Unlock()
		if idle {
			out = append(out, c)
		}
	}
	return out
}

// resetAll resets every connection.
func (n *network) resetAll() {
	n.mu.Lock()
	cs := slices.Clone(n.conns)
	n.mu.Unlock()
	for _, c := range cs {
		n.reset(c)
	}
}

// killAll ends every connection, dial and listener: the world is over.
func (n *network) killAll() {
	n.mu.Lock()
	cs := slices.Clone(n.conns)
	dials := n.dials
	n.dials = nil
	n.msgs = nil
	lns := make([]*listener, 0, len(n.ln))
	for _, ln := range n.ln {
		lns = append(lns, ln)
	}
	n.ups = nil
	n.mu.Unlock()
	for _, d := range dials {
		d.res <- dialResult{err: errRefused(d.id.host + ":80")}
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	for _, c := range cs {
		c.mu.Lock()
		c.broken = true
		c.mu.Unlock()
		c.client.in.fail(errReset("read"))
		c.serverEnd.in.fail(errReset("read"))
	}
}

// queue frames what a side wrote into messages.
func (n *network) queue(c *conn, up bool, kind msgKind, data []byte, key string, status int, replayed bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c.mu.Lock()
	gone := c.broken || c.serverGone && (up || kind != msgReset)
	c.mu.Unlock()
	if gone {
		// A write or a close that checked the connection before it broke
		// or its server died (a killed process's goroutine, woken by its
		// ended context, racing the driver's reset of its sockets): it goes
		// nowhere, as the messages the reset took did. Queued, it would be
		// delivered at one step or another as the race went: one seed, two
		// traces. (The reset a dead server's connections get is the one
		// message queued after it died.)
		return
	}
	i := 0
	if up {
		i = 1
	}
	c.seqs[i]++
	n.msgs = append(n.msgs, &message{conn: c, up: up, seq: c.seqs[i], kind: kind, data: data, key: key, status: status, replayed: replayed})
}

// conn is one connection: two ends, each reading its own wire.
type conn struct {
	net       *network
	id        connID
	server    int // the server process that accepted it
	client    *end
	serverEnd *end

	mu         sync.Mutex
	seqs       [2]int // messages framed so far: down, up
	requests   int    // requests delivered to the server
	responses  int    // responses delivered to the client
	broken     bool   // reset: reads and writes fail
	serverGone bool   // the server's process died: what the client writes goes nowhere
	resetNext  bool   // the driver resets it instead of delivering the next response
	eofNext    bool   // the driver closes it instead of delivering the next response
}

// reused reports whether c carried a whole exchange already: the client
// took it from its pool.
func (c *conn) reused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.responses > 0
}

// end is one side of a conn: a net.Conn.
type end struct {
	c      *conn
	client bool
	in     *wire // what this side reads

	mu     sync.Mutex
	out    []byte // written, not yet a whole message
	closed bool
}

var _ net.Conn = (*end)(nil)

func (e *end) Read(p []byte) (int, error) { return e.in.read(p) }

// Write takes p whole and frames whole messages out of what this side
// has written so far: the driver decides their fate.
func (e *end) Write(p []byte) (int, error) {
	e.c.mu.Lock()
	broken, gone := e.c.broken, e.c.serverGone
	e.c.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return 0, net.ErrClosed
	case broken:
		return 0, errReset("write")
	case gone && e.client:
		return len(p), nil // into a socket whose peer is gone: the reset is on its way
	case gone:
		return 0, net.ErrClosed
	}
	e.out = append(e.out, p...)
	for {
		n, kind, key, status, replayed := frame(e.out, e.client)
		if n == 0 {
			return len(p), nil
		}
		msg := bytes.Clone(e.out[:n])
		e.out = e.out[n:]
		e.c.net.queue(e.c, e.client, kind, msg, key, status, replayed)
	}
}

// Close closes this side: its own reads end, and the other side reads
// EOF once what came before has been delivered.
func (e *end) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	e.in.fail(net.ErrClosed)
	e.c.mu.Lock()
	broken := e.c.broken || e.c.serverGone
	e.c.mu.Unlock()
	if !broken {
		e.c.net.queue(e.c, e.client, msgFin, nil, "", 0, false)
	}
	return nil
}

func (e *end) LocalAddr() net.Addr  { return simAddr(e.c.id.String()) }
func (e *end) RemoteAddr() net.Addr { return simAddr(e.c.id.host + ":80") }

func (e *end) SetDeadline(t time.Time) error {
	e.in.setDeadline(t)
	return nil
}
func (e *end) SetReadDeadline(t time.Time) error {
	e.in.setDeadline(t)
	return nil
}
func (e *end) SetWriteDeadline(time.Time) error { return nil } // writes never block

// frame returns the length of the first whole message in b, 0 if b
// holds none yet: a request (client) or a response (server), with what
// the driver shows of it.
func frame(b []byte, request bool) (n int, kind msgKind, key string, status int, replayed bool) {
	if len(b) == 0 {
		return 0, 0, "", 0, false
	}
	if n, kind, key, status, replayed, ok := quickFrame(b, request); ok {
		return n, kind, key, status, replayed
	}
	return slowFrame(b, request)
}

// quickFrame is frame for what net/http writes here: a head, then a body
// of Content-Length bytes. ok is false for anything else (a chunked
// body, a response without a length), which slowFrame reads.
func quickFrame(b []byte, request bool) (n int, kind msgKind, key string, status int, replayed, ok bool) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return 0, 0, "", 0, false, true // not whole yet
	}
	head := b[:end]
	first, rest, _ := bytes.Cut(head, []byte("\r\n"))
	length := -1
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found {
			return 0, 0, "", 0, false, false
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			v, err := strconv.Atoi(string(value))
			if err != nil || v < 0 {
				return 0, 0, "", 0, false, false
			}
			length = v
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			return 0, 0, "", 0, false, false
		case bytes.EqualFold(name, []byte("Idempotency-Key")):
			key = string(value)
		case bytes.EqualFold(name, []byte("Idempotent-Replayed")):
			replayed = string(value) == "true"
		}
	}
	kind = msgRequest
	if !request {
		kind = msgResponse
		f := bytes.Fields(first)
		if len(f) < 2 {
			return 0, 0, "", 0, false, false
		}
		st, err := strconv.Atoi(string(f[1]))
		if err != nil {
			return 0, 0, "", 0, false, false
		}
		status = st
		if length < 0 && st != http.StatusNoContent && st != http.StatusNotModified && st >= 200 {
			return 0, 0, "", 0, false, false // delimited by the close
		}
	}
	n = end + 4 + max(length, 0)
	if len(b) < n {
		return 0, 0, "", 0, false, true
	}
	return n, kind, key, status, replayed, true
}

// slowFrame is frame by net/http's own parsers.
func slowFrame(b []byte, request bool) (n int, kind msgKind, key string, status int, replayed bool) {
	cr := &countReader{r: bytes.NewReader(b)}
	br := bufio.NewReader(cr)
	if request {
		req, err := http.ReadRequest(br)
		if err != nil {
			return 0, 0, "", 0, false
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return 0, 0, "", 0, false
		}
		return cr.n - br.Buffered(), msgRequest, req.Header.Get("Idempotency-Key"), 0, false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, 0, "", 0, false
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, 0, "", 0, false
	}
	return cr.n - br.Buffered(), msgResponse, "", resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
}

type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// wire is what one side of a conn reads: bytes delivered to it, then
// perhaps an EOF or an error.
type wire struct {
	mu       sync.Mutex
	buf      []byte
	eof      bool
	err      error
	deadline time.Time
	timer    *time.Timer
	wake     chan struct{}
}

func newWire() *wire { return &wire{wake: make(chan struct{}, 1)} }

func (w *wire) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *wire) put(b []byte) {
	w.mu.Lock()
	w.buf = append(w.buf, b...)
	w.mu.Unlock()
	w.signal()
}

func (w *wire) finish() {
	w.mu.Lock()
	w.eof = true
	w.mu.Unlock()
	w.signal()
}

func (w *wire) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.signal()
}

// setDeadline sets the read deadline: net/http's server sets one in the
// past to end a read it started in the background.
func (w *wire) setDeadline(t time.Time) {
	w.mu.Lock()
	w.deadline = t
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if !t.IsZero() {
		if d := time.Until(t); d > 0 {
			w.timer = time.AfterFunc(d, w.signal)
		}
	}
	w.mu.Unlock()
	w.signal()
}

func (w *wire) read(p []byte) (int, error) {
	for {
		w.mu.Lock()
		switch {
		case w.err != nil:
			err := w.err
			w.mu.Unlock()
			return 0, err
		case len(w.buf) > 0:
			n := copy(p, w.buf)
			w.buf = w.buf[n:]
			w.mu.Unlock()
			return n, nil
		case w.eof:
			w.mu.Unlock()
			return 0, io.EOF
		case !w.deadline.IsZero() && !time.Now().Before(w.deadline):
			w.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		w.mu.Unlock()
		<-w.wake
	}
}

// listener is a server process's net.Listener: it hands over the server
// ends of the connections the driver accepted.
type listener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

// backlog bounds the connections accepted and not yet taken by Accept.
const backlog = 64

func newListener() *listener {
	return &listener{ch: make(chan net.Conn, backlog), done: make(chan struct{})}
}

// push hands c to Accept, without waiting for it.
func (l *listener) push(c net.Conn) {
	select {
	case l.ch <- c:
	default:
		_ = c.Close() // a backlog never reached in a seed's world
	}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *listener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *listener) Addr() net.Addr { return simAddr("server:80") }

type simAddr string

func (a simAddr) Network() string { return "tcp" }
func (a simAddr) String() string  { return string(a) }
