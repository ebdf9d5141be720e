package main

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/idemkit/idemhttp"
)

// maxResponseBytes bounds the response body copied into a result line.
const maxResponseBytes = 64 << 10

// The values of result.Result.
const (
	resultOK      = "ok"      // a 2xx response, fresh or replayed
	resultFailed  = "failed"  // a definite failure: a 4xx that a retry would not change, a refused key, an expired entry
	resultPending = "pending" // the outcome is unknown; the journal keeps the key for the next run
)

// The values of result.Source.
const (
	sourceRun     = "run"     // sent from the input in this run
	sourceResume  = "resume"  // a pending entry from an earlier run, resent with its key
	sourceJournal = "journal" // done in an earlier run; not sent again
	sourcePruned  = "pruned"  // pruned from the journal; its recorded outcome, not sent (-pruned skip)
)

// result is one operation's outcome: a JSON line on stdout.
type result struct {
	ID       string         `json:"operation"`          // operation id ("" for a journal entry without one)
	Line     int            `json:"line,omitempty"`     // input line, 0 for an entry not in the input
	Key      string         `json:"key,omitempty"`      // idempotency key
	Result   string         `json:"result"`             // ok, failed or pending
	Source   string         `json:"source"`             // run, resume or journal
	Status   int            `json:"status,omitempty"`   // last HTTP status, 0 if none
	Replayed bool           `json:"replayed,omitempty"` // the server replayed a stored response
	Skipped  bool           `json:"skipped,omitempty"`  // done in an earlier run, not sent
	Attempts int            `json:"attempts,omitempty"` // attempts over all runs, from the journal
	State    idemhttp.State `json:"state,omitempty"`    // the journal entry's state after this run
	// NotBefore is when a parked operation (the server asked to come
	// back later than the client waits) may be sent again: a rerun or
	// resume before then sends nothing.
	NotBefore *time.Time      `json:"not_before,omitempty"`
	Response  json.RawMessage `json:"response,omitempty"` // the response body: JSON as is, anything else as a string
	Error     string          `json:"error,omitempty"`    // why it failed or stays pending; for ok, a broken response body
}

// classify sets r.Result from the status and the journal state: an entry
// still pending is pending whatever else happened, since only a resend
// with its key can settle it. A 2xx is ok even when its body broke off:
// the operation is done and journaled so.
func (r *result) classify() {
	switch {
	case r.State == idemhttp.StatePending:
		r.Result = resultPending
	case r.Status >= 200 && r.Status < 300:
		r.Result = resultOK
	default:
		r.Result = resultFailed
	}
}

// setResponse stores body in r: as JSON when it is a JSON document, else
// as a JSON string; bodies beyond maxResponseBytes are cut, as a string.
func (r *result) setResponse(body []byte) {
	if len(body) == 0 {
		return
	}
	if len(body) <= maxResponseBytes && json.Valid(body) {
		var c bytes.Buffer
		if json.Compact(&c, body) == nil {
			r.Response = c.Bytes()
			return
		}
	}
	b, _ := json.Marshal(string(body[:min(len(body), maxResponseBytes)]))
	r.Response = b
}

// resultWriter writes results as JSON lines, one at a time.
type resultWriter struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error // the first write error; later writes are skipped
}

func newResultWriter(w io.Writer) *resultWriter {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &resultWriter{enc: enc}
}

// write encodes r. A failed write (stdout closed) must not stop the batch:
// the journal still records every outcome. It is reported at the end.
func (w *resultWriter) write(r *result) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = w.enc.Encode(r)
	}
}
