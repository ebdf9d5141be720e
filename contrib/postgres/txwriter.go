package postgres

import (
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/idemkit/idemhttp/idemserver"
)

// The response side of TxMiddleware: the buffered writer, replays, and the
// middleware's own problems.

// unstoredHeaders are never replayed: hop-by-hop fields describe one
// connection (RFC 9110, section 7.6.1), Set-Cookie one session, and the
// framing fields are set again for the replay.
var unstoredHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Set-Cookie", "Content-Length",
}

// storedField reports whether a field of the handler's header, with
// values vs, is sent by a replay. Only the handler's own fields are there
// to begin with: the buffered writer starts from an empty header, not
// from the header that outer middleware filled.
func storedField(name string, _ []string) bool {
	// Compared in canonical form: a field set as h["set-cookie"] is sent
	// as it is spelt, and read by the client as Set-Cookie.
	return !slices.Contains(unstoredHeaders, http.CanonicalHeaderKey(name))
}

func problemRolledBack(key string) *idemserver.Problem {
	return &idemserver.Problem{
		Type:   TypeRolledBack,
		Title:  "Request rolled back",
		Status: http.StatusInternalServerError,
		Detail: "The request failed and nothing was committed; a retry with the same key runs it again.",
		Key:    key,
	}
}

func problemTxEnded(key string) *idemserver.Problem {
	return &idemserver.Problem{
		Type:   TypeTxEnded,
		Title:  "Transaction ended by the handler",
		Status: http.StatusInternalServerError,
		Detail: "The request's handler ended its transaction itself, so its response was not stored; the request will not run again under this key.",
		Key:    key,
	}
}

func problemSerializationFailure(key string) *idemserver.Problem {
	return &idemserver.Problem{
		Type:   TypeSerializationFailure,
		Title:  "Request rolled back by a concurrent transaction",
		Status: http.StatusServiceUnavailable,
		Detail: "The request conflicted with others running at the same time and nothing was committed; retry with the same key after Retry-After.",
		Key:    key,
	}
}

func problemResponseTooLarge(key string, limit int) *idemserver.Problem {
	return &idemserver.Problem{
		Type:   TypeResponseTooLarge,
		Title:  "Response too large to store",
		Status: http.StatusInternalServerError,
		Detail: "The response exceeds the " + strconv.Itoa(limit) + " bytes the server stores with the request's effect, so nothing was committed.",
		Key:    key,
	}
}

// txWriter buffers a handler's response until the commit.
type txWriter struct {
	header      http.Header
	status      int
	body        []byte
	limit       int
	overflow    bool
	switched    bool // the handler answered 101 Switching Protocols
	wroteHeader bool
}

var (
	_ http.ResponseWriter = (*txWriter)(nil)
	_ http.Flusher        = (*txWriter)(nil)
)

func (b *txWriter) Header() http.Header { return b.header }

func (b *txWriter) WriteHeader(code int) {
	// 101 Switching Protocols cannot wait for the commit (nor can the
	// connection be hijacked): the request is refused and rolled back.
	if code == http.StatusSwitchingProtocols {
		b.switched = true
	}
	// 1xx responses would have to reach the client before the commit:
	// dropped, as a proxy may.
	if b.wroteHeader || (code >= 100 && code <= 199) {
		return
	}
	b.wroteHeader = true
	b.status = code
}

func (b *txWriter) Write(p []byte) (int, error) {
	if !b.wroteHeader {
		b.WriteHeader(http.StatusOK)
	}
	if b.overflow {
		return len(p), nil
	}
	if len(b.body)+len(p) > b.limit {
		b.overflow = true
		b.body = nil
		return len(p), nil
	}
	b.body = append(b.body, p...)
	return len(p), nil
}

// Flush does nothing: nothing may reach the client before the commit.
func (b *txWriter) Flush() {}

func (b *txWriter) finalStatus() int {
	if !b.wroteHeader {
		return http.StatusOK
	}
	return b.status
}

// send writes the buffered response to w; step, set only by tests, is
// called halfway through the body (a crash point).
func (b *txWriter) send(w http.ResponseWriter, step func(string)) {
	hdr := w.Header()
	for k, vs := range b.header {
		hdr[k] = vs
	}
	if hdr.Get("Transfer-Encoding") == "" {
		hdr.Set("Content-Length", strconv.Itoa(len(b.body)))
	}
	w.WriteHeader(b.finalStatus())
	if step != nil && len(b.body) > 1 {
		half := len(b.body) / 2
		_, _ = w.Write(b.body[:half])
		_ = http.NewResponseController(w).Flush()
		step("mid-response")
		_, _ = w.Write(b.body[half:])
		return
	}
	_, _ = w.Write(b.body) // a failed write means the client left
}

// bodyReader hands the buffered request body to the handler.
type bodyReader struct{ b []byte }

func (r *bodyReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (*bodyReader) Close() error { return nil }
