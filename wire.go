package idemhttp

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
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
//   - The client never handed the attempt to the caller's RoundTripper
//     (attemptTransport): the context had ended, or the Pacer refused it.
//     Nothing left.
//   - Anything else may have reached the server: a Transport that reports
//     no httptrace events at all (not net/http's: a wrapper's), and
//     net/http's own when it asked for no connection (no GetConn), since
//     then either it refused the request itself (a proxy setting, an
//     unsupported scheme) or a protocol registered with
//     Transport.RegisterProtocol took it, and sent it unseen. The refusals
//     that are net/http's rule alone (invalid header fields, a method that
//     is no token, no host) are the client's too, before the first attempt
//     (unsendable), so they never need that evidence.

// wireTally counts what the connection saw during the current attempt.
// The trace callbacks run on net/http's goroutines.
type wireTally struct {
	getConns atomic.Int32 // GetConn: the transport tried to get a connection
	gotConns atomic.Int32 // GotConn: it got one
	h2Conns  atomic.Int32 // of those, connections that may speak HTTP/2
	writes   atomic.Int32 // WroteHeaders: a whole request head was written; more than one means net/http resent it
	handed   atomic.Int32 // the attempt (or a redirect hop of it) was handed to the caller's RoundTripper

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
	getConns, gotConns, h2Conns, writes, handed int32
}

// take returns the current attempt's counts and starts the next one's.
// Without GotConn traced (HTTP/1.1 only), every connection counts as
// obtained and as HTTP/1.1, which the HTTP/1.1 rule needs no more of.
func (w *wireTally) take() attemptWire {
	a := attemptWire{w.getConns.Swap(0), w.gotConns.Swap(0), w.h2Conns.Swap(0), w.writes.Swap(0), w.handed.Swap(0)}
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
	case w.handed == 0:
		return true // never handed to the transport
	case !traceable:
		return false
	case w.getConns == 0:
		return false // refused by net/http itself, or sent by a registered protocol: no telling
	case w.gotConns == 0:
		return true // no connection obtained
	}
	return w.h2Conns == 0 && w.writes == 0 // HTTP/1.1, and no whole head written
}

// classify classifies a failed attempt from its wire evidence. The one
// exception to "the connection, not the error" is a certificate the
// client refused, which no retry can fix.
func (a *operation) classify(err error, w attemptWire) errClass {
	switch {
	case isCertError(err):
		return errPermanent
	case !w.notSent(a.cfg.traceable):
		return errUnknown
	}
	return errNotSent
}

// unsendable says why net/http's Transport would refuse r by its own
// rules, before connecting, or "" when it would not: a header or trailer
// field name that is no token or a value with a control character (which
// it checks first, for http and https), a method that is no token, no
// host. The client refuses such a request before its first attempt: a
// refusal by net/http during an attempt is no evidence that nothing left
// (see notSent). The message never quotes a value, which may be secret.
// checked: r.Header was checked already, as it was copied
// (cloneChecked), and why is what that found.
func unsendable(r *http.Request, checked bool, why string) string {
	if !isHTTP(r.URL.Scheme) && !strings.EqualFold(r.URL.Scheme, "https") {
		return "" // another scheme is a registered protocol's, or refused as unknown
	}
	if !checked {
		why = badHeader(r.Header)
	}
	if why == "" && len(r.Trailer) > 0 {
		why = badHeader(r.Trailer)
	}
	if why != "" {
		return why
	}
	if r.Method != "" && !isToken(r.Method) {
		return fmt.Sprintf("method %q", r.Method)
	}
	if r.URL.Host == "" {
		return "no host in the URL"
	}
	return ""
}

// isHTTP reports whether scheme is "http", in any letter case.
func isHTTP(scheme string) bool {
	return scheme == "http" || strings.EqualFold(scheme, "http")
}

// badHeader says what of h net/http would refuse to send, "" if nothing.
func badHeader(h http.Header) string {
	for k, vv := range h {
		if why := badField(k, vv); why != "" {
			return why
		}
	}
	return ""
}

// badField says what net/http would refuse of a header field named k
// with values vv: a name that is no token, a value with a control
// character. "" if nothing.
func badField(k string, vv []string) string {
	if !isToken(k) {
		return fmt.Sprintf("header field name %q", k)
	}
	for _, v := range vv {
		for i := 0; i < len(v); i++ {
			if ctl[v[i]] {
				return fmt.Sprintf("a control character in the value of header field %q", k)
			}
		}
	}
	return ""
}

// ctl marks the bytes net/http refuses in a header value: control
// characters but the tab.
var ctl = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c < ' ' && c != '\t' || c == 0x7f
	}
	return t
}()

// tchar marks the bytes an RFC 9110 token is made of.
var tchar = func() (t [256]bool) {
	for c := range 256 {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", byte(c)) >= 0
	}
	return t
}()

// isToken reports whether s is an RFC 9110 token: one or more tchar.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}
