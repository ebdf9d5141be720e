//go:build go1.26

package sim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"

	"github.com/idemkit/idemhttp"
)

// The caller's Policy.Classify (issue 32 §1.1, Config.Classify): a
// classifier for an API's own retry dialect, and a wrong one. For each
// kind of answer (a status; a kind of transport error) the seed says
// whether it has an opinion and which: retry a 200, a 422 or a 409 the
// server answered for good, retry an unknown outcome even unsafely,
// return a 503 as final, take a 200 for a key mismatch or for a request
// in progress. A verdict is the same for every answer of its kind in a
// seed, as a classifier's rule is, and it has none once the faults stop
// (a classifier fixed by then, as callbacks stop panicking). Whatever it
// says, the client's rules must hold: no second run under another key,
// nothing reported not sent that ran, nothing done that did not run (the
// invariants). What it makes the client return is the caller's doing, not
// an error the job cannot have caused (classifierCaused).

// The verdicts a wrong classifier gives a response, and an error.
var (
	respVerdicts = []idemhttp.Verdict{idemhttp.VerdictRetry, idemhttp.VerdictRetryUnsafe, idemhttp.VerdictReturn, idemhttp.VerdictInProgress, idemhttp.VerdictMismatch}
	errVerdicts  = []idemhttp.Verdict{idemhttp.VerdictRetry, idemhttp.VerdictRetryUnsafe, idemhttp.VerdictReturn}
)

// classifier is the Clients' Policy.Classify.
func (w *world) classifier(resp *http.Response, err error) idemhttp.Verdict {
	if !w.faulty.Load() {
		return idemhttp.VerdictDefault
	}
	v := w.verdictFor(answerKind(resp, err), resp != nil)
	if v != idemhttp.VerdictDefault {
		w.count("classifier says " + v.String())
	}
	return v
}

// verdictFor is the seed's verdict for answers of kind.
func (w *world) verdictFor(kind string, isResp bool) idemhttp.Verdict {
	if w.draw(100, "classify", kind) >= w.cfg.Classify {
		return idemhttp.VerdictDefault
	}
	vs := errVerdicts
	if isResp {
		vs = respVerdicts
	}
	return vs[w.draw(len(vs), "verdict", kind)]
}

// answerKind names the kind of an attempt's answer: its status, or the
// kind of its error (by errors.Is and As, as a caller's classifier would
// tell them apart).
func answerKind(resp *http.Response, err error) string {
	if resp != nil {
		return strconv.Itoa(resp.StatusCode)
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "other"
}

// classifierCaused reports whether what call c returned is the wrong
// classifier's doing: a status it returned as final (VerdictReturn), or a
// key mismatch it declared (VerdictMismatch), which a job with a right
// classifier cannot meet.
func (w *world) classifierCaused(c *call) bool {
	if c.class == outStatus {
		return w.classifierFinal(c.status)
	}
	var km *idemhttp.KeyMismatchError
	return errors.As(c.err, &km) && w.classifierFinal(km.StatusCode)
}

// classifierFinal reports whether the wrong classifier makes status final:
// returned as it is (VerdictReturn), or a key mismatch (VerdictMismatch).
// The client then settles the operation on it, done with that status, as
// the caller asked, whether or not the server ran it: an operation so
// settled is resolved (the caller's answer, invariant 4), and its done
// entry needs no effect (7). Only what the caller asked: a second run, or
// a not-sent report of a request that ran, still breaks 1 and 3.
func (w *world) classifierFinal(status int) bool {
	if w.cfg.Classify == 0 || status == 0 {
		return false
	}
	v := w.verdictFor(strconv.Itoa(status), true)
	return v == idemhttp.VerdictReturn || v == idemhttp.VerdictMismatch
}
