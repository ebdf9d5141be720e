//go:build go1.26

package sim

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strconv"
	"sync"
)

// Kept results as a caller reads them (issue 31 §1.6 and §1.7, in the
// world by issue 32 §1.1): a server that compresses its answers
// (Config.Gzip: the operations whose answers are gzip-encoded), a caller
// that asks for the encoding itself and decodes what it reads
// (Config.AcceptGzip: net/http then leaves the body as it came, with its
// Content-Encoding), and answers that carry a URL-valued header with a
// secret in it (Config.SignedLocation: Location, a signed URL of the
// charge). With Policy.KeepResults a rerun replays the journal's copy:
// it must read as the first answer did (invariant 2: the body it got is
// the one the server produced; a copy without its Content-Encoding is
// not), and no signature may reach the journal (invariant 6).

// locationSecret is in every signed Location's signature.
const locationSecret = "LOCATION_SECRET"

// answer sets what the answer to e carries besides its body (a signed
// Location, a Content-Encoding) on h, and returns the body to write.
func (w *world) answer(h http.Header, e *effect) []byte {
	if w.cfg.SignedLocation && h.Get("Location") == "" {
		h.Set("Location", w.scheme()+"://"+"op"+strconv.Itoa(e.op)+".sim/v1/charges/"+e.charge+"?sig="+locationSecret+"-"+e.charge)
	}
	if len(e.body) > maxStored || w.draw(100, "gzip", e.op) >= w.cfg.Gzip {
		// An answer over the stored limit stays over it: compressed,
		// 512 bytes of padding would not be.
		return e.body
	}
	var b bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	zw.Reset(&b)
	_, _ = zw.Write(e.body)
	_ = zw.Close()
	gzipWriters.Put(zw)
	h.Set("Content-Encoding", "gzip")
	h.Del("Content-Length")
	return b.Bytes()
}

// gzipWriters are answer's encoders, reused: a gzip.Writer's compressor
// is about a megabyte to allocate and clear, which was 40% of the bytes a
// run of seeds allocated. Reset gives the bytes a new one would.
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(io.Discard) }}

// readAnswer reads resp's body as the job does: decoded (see decoded).
func readAnswer(resp *http.Response) ([]byte, error) {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return body, err
	}
	return decoded(resp.Header, body), nil
}

// decoded is body as the job reads it: decoded when its header says it
// is gzip-encoded (the job asked for the encoding itself); as it came
// otherwise, or when it is not what its header says, so that the
// invariants see what it is.
func decoded(h http.Header, body []byte) []byte {
	if h.Get("Content-Encoding") != "gzip" {
		return body
	}
	zr, err := gzip.NewReader(bytes.NewReader(body))
	if err != nil {
		return body
	}
	dec, err := io.ReadAll(zr)
	if err != nil {
		return body
	}
	return dec
}
