package idemhttp

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/idemkit/idemhttp/internal/contract"
)

// keepResult reads resp's body, up to limit bytes, into a Result to keep
// with the done entry, and gives resp the same body back. A larger body is
// not kept at all (a partial copy is no result), and resp still reads
// whole. The body is kept as the caller reads it (decoded if net/http
// decoded it, else as it came, with its Content-Encoding), and the
// headers as contract.ResultHeader keeps them, with the policy's own
// secret query names and paths (names, pathAfter) redacted too; the
// journal applies the defaults again (Outcome.Sanitized).
func keepResult(resp *http.Response, limit int64, names, pathAfter []string) *Result {
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	buf, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil || int64(len(buf)) > limit {
		putBack(resp, buf, err)
		return nil
	}
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(buf))
	return &Result{Status: resp.StatusCode, Header: contract.ResultHeader(resp.Header, names, pathAfter), Body: buf}
}

// replayResult is the response a rerun of a done operation gets from the
// result the journal kept: marked a replay, since nothing ran now.
func (a *operation) replayResult(req *http.Request, r *Result) *http.Response {
	a.fromJournal = true
	h := r.Header.Clone()
	if h == nil {
		h = make(http.Header)
	}
	h.Set("Idempotent-Replayed", "true")
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", r.Status, http.StatusText(r.Status)),
		StatusCode:    r.Status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(bytes.Clone(r.Body))),
		ContentLength: int64(len(r.Body)),
		Request:       req.WithContext(&a.cctx),
	}
}

// redact replaces the URL of a *url.Error at the top of err with one
// without the URL's secrets (contract.RedactURL): net/http's keeps the
// user name and every query value, and the error reaches logs, events
// and SDKs.
func (a *operation) redact(err error) error {
	if err == nil {
		return nil
	}
	ue, ok := err.(*url.Error)
	if !ok {
		return err
	}
	return &url.Error{Op: ue.Op, URL: contract.RedactURLString(ue.URL, a.p.redactQuery, a.p.redactPath), Err: ue.Err}
}
