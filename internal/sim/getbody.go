//go:build go1.26

package sim

import (
	"bytes"
	"encoding/json"
	"io"
)

// A GetBody that changes (issue 32 §1.1, Config.BodyChange): a body
// streamed from elsewhere (a file, a blob store) that someone rewrites
// between the first read and a retry's. For BodyChange percent of the
// streamed calls, GetBody gives other bytes than the body the request
// came with: the same length (so that nothing but its content differs
// from what the first attempt declared), another amount. The client
// holds every journaled call's body in memory and resends those bytes,
// never GetBody's: a changed body must never reach the server under the
// call's key. If it did, the server's fingerprint would refuse it (422, a
// key mismatch: an error the job cannot have caused), or, where the
// server never saw the first, charge another amount.

// getBody is call c's GetBody, for its body.
func (w *world) getBody(c *call, body []byte) func() (io.ReadCloser, error) {
	if w.draw(100, "bodychange", c.id) >= w.cfg.BodyChange {
		return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	var req chargeRequest
	_ = json.Unmarshal(body, &req)
	changed := body
	for amount := req.Amount + 1; ; amount++ {
		b, _ := json.Marshal(chargeRequest{Op: req.Op, Amount: amount})
		if len(b) == len(body) {
			changed = b
			break
		}
	}
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(changed)), nil }
}
