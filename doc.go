// Package idemhttp is an HTTP client that makes retrying safe.
//
// A caller that gets no answer cannot tell "never happened" from "happened,
// reply lost", so it must retry, and a retry may run the operation twice:
// two charges, two orders, two e-mails. A [Client] mints an Idempotency-Key
// before the first attempt, sends it with a byte-identical body on every
// retry, retries only what the wire contract marks safe (timeouts and
// connection errors, 409 while the first request still runs, 429 and 503
// honouring Retry-After, keyed 5xx), within the context's deadline and a
// retry budget, and returns typed errors. With a [Journal], the key is on
// disk before the first byte leaves, so that a process that dies mid-request
// resends it with the same key after a restart ([Client.Resume]), and a rerun
// of a done operation sends nothing.
//
//	c := &idemhttp.Client{}                 // the zero value works
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	resp, err := c.Do(req)                  // keyed, retried, typed errors
//	var g *idemhttp.GiveUpError
//	switch {
//	case err == nil:                        // close resp.Body, as with net/http
//	case errors.Is(err, idemhttp.ErrKeyMismatch): // a bug: same key, another body
//	case errors.Is(err, idemhttp.ErrNotSent):     // nothing reached the server
//	case errors.As(err, &g):                      // gave up: g.Key, g.LastStatus, g.Reason
//	}
//
// A batch job names each operation, so that a rerun after a crash reuses its
// key and skips what is done:
//
//	j, _ := filejournal.Open("charges.journal", nil)
//	c := &idemhttp.Client{Journal: j, Policy: &idemhttp.Policy{KeepResults: 64 << 10}}
//	c.Resume(ctx, nil)                      // at start-up: what a crash left pending
//	resp, err := c.Do(req.WithContext(idemhttp.WithOperation(ctx, "invoice-42")))
//
// # The contract
//
// What each answer makes the client do is the README's table; in short:
// a 2xx is done ([Replayed] tells a replay); a 409 that says the key is in
// progress is waited out; a 422 (or Stripe's 400) that says the key was
// used with another request is a [*KeyMismatchError]; an application's own
// 4xx comes back as a response, like any 4xx; whether a failed attempt can
// have reached the server is decided from what the connection saw
// (net/http/httptrace, per protocol), never from the error's type, and a
// request without a key and with a non-idempotent method whose outcome is
// unknown is never resent. Every call of an operation goes through one
// lifecycle (docs/lifecycle.md): within a process it has one sender at a
// time, and its journal entry is written in one place, from the evidence.
//
// SDKs that take an *http.Client get the same behaviour through
// [Client.StandardClient] (stripe-go among them). The events of every
// decision are in package idemtrace; the embedded journal is package
// filejournal; package idemserver is the server half as net/http middleware,
// and idemtest a fault-injecting fake API; the nested module contrib/postgres
// keeps the server's record in the business transaction, and package inbox
// does the same for queue consumers.
package idemhttp
