package idemhttp

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"
)

// This file sends a call's first attempt itself and hands the call over to
// go-retryablehttp's engine only for a retry: most calls succeed at once,
// and the engine costs a Client, a body closure and its own bookkeeping per
// call.
//
// Why the outcome cannot differ from the engine's. Every decision of the
// lifecycle is taken in functions both paths call, in the order the
// engine's loop (retryablehttp.Client.Do, v0.7.8) calls them, with the
// same arguments:
//
//   - hooks and the Pacer: engineRequestHook before the attempt (the
//     engine's RequestLogHook, installed under the same condition, hooked);
//     a Pacer's refusal is taken by handOver, in attemptTransport, which
//     both paths send through;
//   - evidence of sending: the httptrace of the call's context (wire.go)
//     and handOver, both in the request and its transport, which are the
//     same objects; checkRetry reads them after the attempt, as the
//     engine's CheckRetry (engineCheckRetry) does;
//   - redirects: a response net/http's Client would follow goes to that
//     Client (hc, the engine's own), which follows it by the same
//     CheckRedirect; send only spares it the first hop's resend
//     (operation.replay). Everything else http.Client.Do does for one hop
//     send does the same way (TestSendMatchesHTTPClient compares the two
//     answer by answer), or leaves to http.Client whole;
//   - PrepareRequest and the header checks run before run, on out, for
//     both;
//   - the outcome, parking included: checkRetry (which decides a retry, a
//     give-up and a park) and engineErrorHandler, then finish and settle,
//     the same functions;
//   - between attempts: the 4 KiB drain, the wait on a.delay (which
//     engineBackoff would return), the cancellation's bare context error
//     (which finish joins), PrepareRetry on a shallow copy: the engine's
//     steps, in its order. From the second attempt on, the engine runs
//     the call (retryEngine);
//   - a panic anywhere unwinds through the same frames' defers: proceed's
//     unwind, with lastResp set by roundTripFor on either path.
//
// TestFirstAttemptMatchesEngine runs calls of every kind (answers, errors
// before and after the wire, redirects followed and refused, PrepareRequest,
// hooks, a Pacer's refusal, a Retry-After that parks, panics, streamed
// bodies) both ways (config.engineFirst sends the first attempt through the
// engine, as before) and compares what the caller, the hooks, the server
// and the journal see.
//
// send sends one attempt as http.Client.Do would, without the redirect
// bookkeeping it pays for on every request (a copy of the header, a
// closure, the list of hops) before it knows whether a redirect comes: a
// response it would follow (301, 302, 303, 307, 308) goes to http.Client
// after all, which gets that response for the request instead of sending
// it again (operation.replay) and follows on by its own rules. A request
// http.Client would change before sending (a user name in the URL makes it
// add Authorization; a nil Header) or refuse (RequestURI set) goes through
// http.Client whole, and so does a request of another scheme than http and
// https (a protocol registered with the Transport).
//
// http.Client copies a request's header onto a redirect's next hop as it
// was before the first hop was sent. A RoundTripper other than net/http's
// Transport may change the header in place (the RoundTripper contract
// forbids it; many do, adding an API key for their own host): for one,
// send keeps a copy of the header as it sends the first hop, and hands
// http.Client that, so that what the RoundTripper added for one host
// never follows a redirect to another (net/http's Transport changes
// nothing, and costs no copy).

// retryEngine is go-retryablehttp's engine and its request, made for a
// call's first retry.
type retryEngine struct {
	engine retryablehttp.Client
	rreq   retryablehttp.Request
}

// run sends the call's attempts, out being the first, and returns what the
// engine's Client.Do would have returned for them.
func (a *operation) run(out *http.Request) (*http.Response, error) {
	if a.cfg.engineFirst {
		if a.stream != nil {
			a.stream.handFirst = true // the engine's first rewind sends the caller's Body
		}
		return a.retryEngine(out)
	}
	if a.hooked() {
		engineRequestHook(nil, out, 0)
	}
	resp, doErr := a.send(out)
	ctx := out.Context()
	retry, checkErr := a.checkRetry(ctx, resp, doErr)
	if !retry && doErr == nil && checkErr == nil {
		return resp, nil
	}
	return a.afterFirst(out, resp, doErr, checkErr, retry)
}

// afterFirst is run after a first attempt that did not simply succeed:
// its error handed back, or the retries, retry being checkRetry's
// decision and checkErr its error.
//
//go:noinline
func (a *operation) afterFirst(out *http.Request, resp *http.Response, doErr, checkErr error, retry bool) (*http.Response, error) {
	if !retry {
		err := checkErr
		if err == nil {
			err = doErr
		}
		return engineErrorHandler(resp, err, 1)
	}
	ctx := out.Context()
	// What the engine does between two attempts: drain the response (4 KiB
	// at most, after wait's own bounded drain), wait, and prepare the next
	// attempt on a shallow copy of the request, since net/http's write loop
	// may still be closing the body of the one before.
	if doErr == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		_ = resp.Body.Close()
	}
	t := time.NewTimer(a.delay)
	select {
	case <-ctx.Done():
		t.Stop()
		return nil, ctx.Err()
	case <-t.C:
	}
	next := *out
	_ = enginePrepareRetry(&next) // never fails
	return a.retryEngine(&next)
}

// hooked reports whether the call has attempt hooks or a Pacer: then
// engineRequestHook runs before every attempt.
func (a *operation) hooked() bool {
	h := &a.cfg.hooks
	return h.OnAttempt != nil || h.OnAttemptDone != nil || a.p.pacer != nil
}

// retryEngine makes the call's engine and runs the attempts after the
// first on it, next being the second (or all of them, next the first,
// under config.engineFirst).
func (a *operation) retryEngine(next *http.Request) (*http.Response, error) {
	e := &retryEngine{}
	a.eng = e
	e.rreq.Request = next
	if a.mem.len() > 0 || a.stream != nil {
		rf := a.body
		if a.mem.len() > 0 {
			rf = a.memBody
		}
		next.Body = nil
		a.probing = true // SetBody reads the body once to measure it
		err := e.rreq.SetBody(retryablehttp.ReaderFunc(rf))
		a.probing = false
		if err != nil {
			return nil, fmt.Errorf("idemhttp: %w: body: %w", ErrNotReplayable, err)
		}
		e.rreq.ContentLength = a.bodyLen
	}
	e.engine = retryablehttp.Client{
		HTTPClient:   a.cfg.hc,
		RetryWaitMin: a.delay,
		RetryMax:     1<<31 - 1, // checkRetry decides when to stop
		CheckRetry:   engineCheckRetry,
		Backoff:      engineBackoff,
		PrepareRetry: enginePrepareRetry,
		ErrorHandler: engineErrorHandler,
	}
	if a.hooked() {
		e.engine.RequestLogHook = engineRequestHook
	}
	return e.engine.Do(&e.rreq)
}

// send sends one attempt through the caller's RoundTripper as http.Client
// would (see the file's comment).
func (a *operation) send(req *http.Request) (*http.Response, error) {
	hc := a.cfg.hc
	if req.URL.User != nil || req.Header == nil || req.RequestURI != "" ||
		!isHTTP(req.URL.Scheme) && !strings.EqualFold(req.URL.Scheme, "https") {
		return hc.Do(req)
	}
	// The header as the first hop got it, for a redirect's next hop (see
	// the file's comment): a RoundTripper other than net/http's Transport
	// may change it in place.
	var sent http.Header
	if !a.cfg.traceable {
		sent = req.Header.Clone()
	}
	resp, err := a.cfg.at.roundTripFor(a, req)
	if err != nil || resp == nil || resp.Body == nil {
		return a.sendOdd(req, resp, err, sent)
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return a.redirected(req, resp, sent)
	}
	return resp, nil
}

// sendOdd is send's answer to what the RoundTripper returned other than a
// response with a body: its error, or what http.Client makes of a nil
// response or body (sent as for redirected).
//
//go:noinline
func (a *operation) sendOdd(req *http.Request, resp *http.Response, err error, sent http.Header) (*http.Response, error) {
	rt := a.cfg.at
	if err != nil {
		if tlsErr, ok := err.(tls.RecordHeaderError); ok && string(tlsErr.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch // as http.Client says it
		}
		return nil, &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(), Err: err}
	}
	if resp == nil {
		return nil, &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(),
			Err: fmt.Errorf("http: RoundTripper implementation (%T) returned a nil *Response with a nil error", rt)}
	}
	if resp.ContentLength > 0 && req.Method != http.MethodHead {
		return nil, &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(),
			Err: fmt.Errorf("http: RoundTripper implementation (%T) returned a *Response with content length %d but a nil Body", rt, resp.ContentLength)}
	}
	resp.Body = io.NopCloser(strings.NewReader(""))
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return a.redirected(req, resp, sent)
	}
	return resp, nil
}

// redirected hands a 3xx to http.Client, which follows it if it is a
// redirect it follows (301, 302, 303, 307, 308), from the response send
// has (operation.replay), with the header as the first hop got it
// (sent, nil if req's own).
//
//go:noinline
func (a *operation) redirected(req *http.Request, resp *http.Response, sent http.Header) (*http.Response, error) {
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		if sent != nil {
			r := *req
			r.Header = sent
			req = &r
		}
		a.replay = resp
		resp, err := a.cfg.hc.Do(req)
		a.replay = nil // taken by its first RoundTrip; never left for another attempt
		return resp, err
	}
	return resp, nil
}

// urlErrorOp is the Op of http.Client's *url.Error for method.
func urlErrorOp(method string) string {
	if method == "" {
		return "Get"
	}
	for i := 0; i < len(method); i++ {
		if c := method[i]; c < ' ' || c > '~' {
			return method
		}
	}
	return method[:1] + strings.ToLower(method[1:])
}
