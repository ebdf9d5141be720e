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
// call. run does for the first attempt what the engine's loop does (the
// request hook, the attempt, CheckRetry, the ErrorHandler; for a retry the
// drain, the wait and PrepareRetry) in the same order and with the same
// functions, so an outcome is decided the same whichever sent the
// attempt; TestFirstAttemptMatchesEngine pins it.
//
// send sends one attempt as http.Client.Do would, without the redirect
// bookkeeping it pays for on every request (a copy of the header, a
// closure, the list of hops) before it knows whether a redirect comes: a
// response it would follow (301, 302, 303, 307, 308) goes to http.Client
// after all, which gets that response for the request instead of sending
// it again (operation.replay) and follows on by its own rules. A request
// http.Client would change before sending (a user name in the URL makes it
// add Authorization; a nil Header) or refuse (RequestURI set) goes through
// http.Client whole.

// retryEngine is go-retryablehttp's engine and its request, made for a
// call's first retry.
type retryEngine struct {
	engine retryablehttp.Client
	rreq   retryablehttp.Request
}

// run sends the call's attempts, out being the first, and returns what the
// engine's Client.Do would have returned for them.
func (a *operation) run(out *http.Request) (*http.Response, error) {
	if a.hooked() {
		engineRequestHook(nil, out, 0)
	}
	resp, doErr := a.send(out)
	ctx := out.Context()
	retry, checkErr := a.checkRetry(ctx, resp, doErr)
	if !retry {
		if doErr == nil && checkErr == nil {
			return resp, nil
		}
		err := checkErr
		if err == nil {
			err = doErr
		}
		return engineErrorHandler(resp, err, 1)
	}
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
// first on it, next being the second.
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
	if req.URL.User != nil || req.Header == nil || req.RequestURI != "" {
		return hc.Do(req)
	}
	rt := a.cfg.at
	resp, err := rt.roundTripFor(a, req)
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
	if resp.Body == nil {
		if resp.ContentLength > 0 && req.Method != http.MethodHead {
			return nil, &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(),
				Err: fmt.Errorf("http: RoundTripper implementation (%T) returned a *Response with content length %d but a nil Body", rt, resp.ContentLength)}
		}
		resp.Body = io.NopCloser(strings.NewReader(""))
	}
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		a.replay = resp
		return hc.Do(req)
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
