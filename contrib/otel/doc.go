// Package otel records what an [idemhttp.Client] does as OpenTelemetry
// traces and metrics, through the client's [idemtrace.Hooks].
//
// Each call gets an internal span ("idemhttp POST") with a child client
// span per attempt that follows the HTTP client semantic conventions
// (http.request.method, url.full with credentials redacted,
// server.address, server.port, http.response.status_code,
// http.request.resend_count, error.type). An attempt that is retried
// carries idemhttp.retry.reason and idemhttp.retry.delay_ms; a call that gives
// up carries idemhttp.give_up.reason and an error status. The idempotency
// key and the operation id are recorded only when [Options] allow it.
//
// Metrics (all under idemhttp.client.): attempts, retries by reason,
// give-ups by reason, budget refusals, in-progress waits, calls by outcome,
// journal operations, and gauges of the retry budget's tokens, calls in
// flight and pending journal entries, read from [idemhttp.Client.Stats].
//
// [Instrumentation.Transport] puts each attempt span's trace context in
// the attempt's headers, so the server's spans join the trace.
//
// On the server, [NewServer] returns the [idemserver.Hooks] that count an
// idemserver.Middleware's claims by outcome (replays, 409s, 422s),
// stored responses, releases by reason, renewal failures, store errors
// and refusals (metrics under idemhttp.server.), and add events to the
// server span an HTTP instrumentation such as otelhttp put in the
// request's context; it starts no spans of its own.
package otel
