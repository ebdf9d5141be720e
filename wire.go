package idemhttp

import (
	"crypto/tls"
	"net/http/httptrace"
	"sync/atomic"
)

// This file decides, from what the connection saw (net/http/httptrace)
// and never from the error's type, whether a failed attempt can have
// reached the server. "Not sent" needs positive evidence, and what counts
// as evidence differs by protocol:
//
//   - Any protocol: the transport tried to connect (GetConn) and obtained
//     no connection (no GotConn): a refused connection, a DNS failure, a
//     failed TLS handshake. Nothing of the request left.
//   - HTTP/1.1: a connection was obtained and no whole request head was
//     written (no WroteHeaders). net/http reports WroteHeaders once the
//     head is in the connection's buffer, before any flush, so without it
//     the server got at most a partial head, which it cannot act on.
//   - HTTP/2: WroteHeaders comes only after the HEADERS frame was written
//     and flushed, and RoundTrip can return (a timeout, a cancel) while
//     that write is still under way: without WroteHeaders the frame may
//     still reach the server. So once an HTTP/2 connection was obtained,
//     the attempt may have been sent. Which protocol a connection speaks
//     is read from its TLS state (ALPN "h2"); a Transport that may speak
//     HTTP/2 without TLS (Protocols.UnencryptedHTTP2) makes every
//     connection without TLS one that may.
//   - net/http's own Transport never tried to connect: it refused the
//     request itself (an invalid header, an unsupported scheme, a proxy
//     setting). Nothing left, and an identical retry fails identically.
//   - Anything else, including a Transport that reports no httptrace
//     events at all (not net/http's: a wrapper's), may have reached the
//     server.

// wireTally counts what the connection saw during the current attempt.
// The trace callbacks run on net/http's goroutines.
type wireTally struct {
	getConns atomic.Int32 // GetConn: the transport tried to get a connection
	gotConns atomic.Int32 // GotConn: it got one
	h2Conns  atomic.Int32 // of those, connections that may speak HTTP/2
	writes   atomic.Int32 // WroteHeaders: a whole request head was written; more than one means net/http resent it

	connsKnown bool // GotConn is traced: the request may go over HTTP/2
}

// install points trace's callbacks at w. h2: the request may go over
// HTTP/2 (https, or a Transport that speaks it without TLS), which needs
// the connections told apart; over HTTP/1.1 only, a missing WroteHeaders
// is the evidence whether or not a connection was obtained, and GotConn
// is left unset (one allocation less per call). h2c: a connection
// without TLS may speak HTTP/2 too.
func (w *wireTally) install(trace *httptrace.ClientTrace, h2, h2c bool) {
	trace.GetConn = func(string) { w.getConns.Add(1) }
	w.connsKnown = h2
	if h2 {
		trace.GotConn = func(info httptrace.GotConnInfo) {
			w.gotConns.Add(1)
			if maySpeakH2(info, h2c) {
				w.h2Conns.Add(1)
			}
		}
	}
	trace.WroteHeaders = func() { w.writes.Add(1) }
}

// maySpeakH2 reports whether the connection may carry HTTP/2.
func maySpeakH2(info httptrace.GotConnInfo, h2c bool) bool {
	if tc, ok := info.Conn.(*tls.Conn); ok {
		return tc.ConnectionState().NegotiatedProtocol == "h2"
	}
	return h2c || info.Conn == nil
}

// attemptWire is what one attempt's connection saw.
type attemptWire struct {
	getConns, gotConns, h2Conns, writes int32
}

// take returns the current attempt's counts and starts the next one's.
// Without GotConn traced (HTTP/1.1 only), every connection counts as
// obtained and as HTTP/1.1, which the HTTP/1.1 rule needs no more of.
func (w *wireTally) take() attemptWire {
	a := attemptWire{w.getConns.Swap(0), w.gotConns.Swap(0), w.h2Conns.Swap(0), w.writes.Swap(0)}
	if !w.connsKnown {
		a.gotConns = a.getConns
	}
	return a
}

// notSent reports positive evidence that nothing the server could act on
// left during the attempt (see the file's comment). traceable: the
// Transport is net/http's and reports the events.
func (w attemptWire) notSent(traceable bool) bool {
	switch {
	case !traceable:
		return false
	case w.getConns == 0:
		return true // refused by net/http itself, before connecting
	case w.gotConns == 0:
		return true // no connection obtained
	}
	return w.h2Conns == 0 && w.writes == 0 // HTTP/1.1, and no whole head written
}

// classify classifies a failed attempt from its wire evidence. The one
// exception to "the connection, not the error" is a certificate the
// client refused, which no retry can fix.
func (a *operation) classify(err error, w attemptWire) errClass {
	if isCertError(err) {
		return errPermanent
	}
	switch {
	case !w.notSent(a.cfg.traceable):
		return errUnknown
	case w.getConns == 0 && !isTimeout(err):
		return errPermanent // net/http refused it locally: an identical retry fails identically
	}
	return errNotSent
}
