// Package idemhttp makes retrying HTTP requests safe.
//
// A caller that gets no answer cannot tell "never happened" from "happened,
// reply lost", so it must retry, and a retry may run the operation twice:
// two charges, two orders, two e-mails. Retrying until acknowledged
// (at-least-once) while the server deduplicates by a key (at-most-once)
// gives effectively-once. idemhttp is the client half of that contract:
//
//   - Keys before the first attempt. A request that needs one (POST and
//     PATCH by default) gets an Idempotency-Key before its first attempt,
//     and every retry carries the same key and a byte-identical body.
//   - Safe retries. Timeouts, connection errors, 409 (still in progress on
//     the server), 429 and 503 (honouring Retry-After) and keyed 5xx are
//     retried with jittered exponential backoff, never past the context's
//     deadline, within a per-client retry budget so an outage is not
//     multiplied. A request without a key whose outcome is unknown is never
//     resent.
//   - Typed errors. A key reused with a different payload (422, or Stripe's
//     400 idempotency_error), retries exhausted, a 409 that never clears,
//     a Retry-After too long, a body that changed between attempts: each is
//     an error usable with errors.Is and errors.As ([ErrKeyMismatch],
//     [*GiveUpError], ...). A 409 or 422 is read as an idempotency signal
//     only on evidence (the body's problem type or Stripe error, a
//     Retry-After, whether the key can have been used before); an
//     application's own validation or conflict response comes back as a
//     response, like any 4xx.
//   - Wire evidence. Whether a failed attempt can have reached the server
//     is decided from what the connection saw (net/http/httptrace: was a
//     request head written?), never from the error's type.
//   - Durable pending keys. With a [Journal] such as [github.com/idemkit/idemhttp/filejournal.Journal], each
//     key is on disk before the first attempt, so after a crash
//     [Client.Resume] resends with the same key instead of charging twice.
//   - Observability and extension. [idemtrace.Hooks] report every decision (attempts,
//     retries, give-ups, budget refusals, journal writes) at no cost when
//     unset; [Policy.Classify] teaches the client an API's own retry
//     dialect; [WithAttempts] and [WithInProgressPatience] override the
//     policy for one call; [Client.Stats] feeds health checks. The nested
//     module contrib/otel turns the hooks into OpenTelemetry spans and
//     metrics.
//
// Usage:
//
//	c := &idemhttp.Client{}             // the zero value works
//	req, _ := http.NewRequestWithContext(ctx, "POST", url, body)
//	resp, err := c.Do(req)              // keyed, retried, typed errors
//	var g *idemhttp.GiveUpError
//	switch {
//	case errors.Is(err, idemhttp.ErrKeyMismatch): // a bug: same key, other body
//	case errors.As(err, &g):                      // gave up; g.Key, g.LastStatus
//	}
//
// SDKs that take an *http.Client get the same behaviour through
// [Client.StandardClient]. The subpackages idemserver (middleware enforcing
// the server half) and idemtest (a fault-injecting fake API) serve tests
// and servers.
package idemhttp
