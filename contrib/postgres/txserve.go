package postgres

import (
	"context"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// The transactional shell: TxMiddleware's keyed requests through the
// server core (internal/servercore), which takes every decision, the same
// core idemserver.Middleware runs on. What is here maps them onto the
// transaction's statements, the buffered response and the hooks.

// serve runs one keyed request in a transaction. A request whose
// transaction ends in a serialization failure or a deadlock runs again,
// in a new transaction, while the core allows (SerializationRetries).
func (h *txHandler) serve(w http.ResponseWriter, r *http.Request, c *txClaim) {
	m := h.m
	// The work must be finished and recorded even when the client leaves;
	// a rollback then would only make its retry run the request again.
	// The claim alone waits on the client: a request nobody waits for
	// holds no connection.
	ctx := context.WithoutCancel(r.Context())
	rep := h.reporter(r, c)
	q := m.core.Start()
	var run *txRun
	defer func() {
		// A panic in a callback of the server author's while the run is
		// open (OnClaim for a new key, ShouldStore) goes on to net/http
		// like the handler's own: roll back, or the transaction and its
		// connection are held for as long as the process lives, the key
		// locked (409 for ever) and the pool one connection short.
		// Nothing ran, or nothing committed: the key is free again.
		if run != nil && !run.closed {
			d := newDBStep(ctx, m.dbTimeout)
			defer d.done()
			run.rollback(&d, m.wire)
		}
	}()
	for attempt := 0; ; attempt++ {
		d := newDBStep(r.Context(), m.dbTimeout)
		var (
			found servercore.Found
			err   error
		)
		run, found, err = h.claim(&d, c)
		d.done()
		if attempt == 0 {
			rep.claimed()
		}
		v := q.Claimed(servercore.Claim{Err: err, Found: found, Fingerprint: c.fingerprint, Request: r, Body: c.body}, w.Header())
		if v.Answer != servercore.AnswerRun {
			o, status := h.answer(w, r, c, v)
			if attempt == 0 {
				rep.claim(o, status)
			} else {
				// A run rolled back by a serialization failure, whose
				// retry found the key taken meanwhile.
				rep.released(idemserver.ReleaseRolledBack, status)
			}
			return
		}
		if attempt == 0 {
			rep.claim(idemserver.ClaimNew, 0)
		}
		if !h.runOnce(ctx, w, r, c, run, &q, &rep) {
			return
		}
		// Run again, as a new run of the key, with the body from the start.
		m.logger.InfoContext(ctx, "idemhttp/postgres: serialization failure; running the request again", m.logKey(c.Key), "attempt", attempt+1)
		q.Restart()
		c.Token = m.newToken()
		r.Body = &bodyReader{b: c.body}
		sleepJitter(attempt)
	}
}

// sleepJitter waits a random time up to 2^attempt ms (at most 64 ms), so
// that transactions that conflicted do not meet again at once.
func sleepJitter(attempt int) {
	d := time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt, 6)))
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// runOnce runs the handler in run, an open transaction whose claim row
// holds the key, and carries out what the core decides of its end. It
// returns true instead when the core says to run the request again
// (nothing was answered).
func (h *txHandler) runOnce(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, run *txRun, q *servercore.Request, rep *txReport) (again bool) {
	r = r.WithContext(context.WithValue(r.Context(), txKeyContext{}, c.TxKey))
	buf := &txWriter{header: make(http.Header), limit: h.m.maxStored}
	returned, planned := false, false
	defer func() {
		var ev servercore.Handler
		switch {
		case !returned:
			// A panic: the core rolls back (or keeps the key, if the
			// handler ended the transaction), then the panic goes on to
			// net/http with nothing answered.
			ev = servercore.Handler{Panicked: true}
		case !planned:
			// The server author's ShouldStore panicked: the same.
			ev = servercore.Handler{Unjudged: true, Status: buf.finalStatus()}
		default:
			return
		}
		run.lent.close()
		ev.Tx = run.state()
		plan := q.Returned(ev)
		h.settle(ctx, nil, r, c, run, q, plan, buf, rep)
	}()
	herr := h.next.ServeHTTPTx(buf, r, &run.lent)
	run.lent.close() // nothing more through it, from a goroutine the handler left either
	returned = true
	h.step("handler")
	if herr != nil {
		h.m.logger.ErrorContext(ctx, "idemhttp/postgres: handler failed", h.m.logKey(c.Key), "error", herr)
	}
	plan := q.Returned(servercore.Handler{
		Err:           herr,
		Serialization: serializationFailure(herr),
		Wrote:         buf.wroteHeader,
		Status:        buf.finalStatus(),
		Hijacked:      buf.switched,
		Overflow:      buf.overflow,
		ClientGone:    r.Context().Err() != nil,
		Tx:            run.state(),
	})
	planned = true
	return h.settle(ctx, w, r, c, run, q, plan, buf, rep)
}

// settle carries out the core's plan for a run's end and what follows
// from it (a look at the key after a rollback, the marker of a handler
// that ended its transaction), then answers (unless w is nil: a panic)
// and tells the hooks. It returns true when the request runs again.
func (h *txHandler) settle(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, run *txRun, q *servercore.Request, plan servercore.Plan, buf *txWriter, rep *txReport) (again bool) {
	m := h.m
	d := newDBStep(ctx, m.dbTimeout)
	defer d.done()
	var (
		step servercore.Step
		err  error
	)
	switch plan.Do {
	case servercore.Keep:
		record := servercore.EncodeHead(plan.Status, buf.header, len(buf.body), storedField)
		record = append(record, buf.body...)
		h.step("before-commit")
		var outcome servercore.Commit
		outcome, err = run.commit(&d, m, c, record, h.step)
		if outcome == servercore.CommitOK {
			h.step("after-commit")
		}
		step = q.Committed(outcome)
	case servercore.Release:
		step = q.RolledBack(run.end(&d, m.wire))
	default: // KeepUnreplayable: the handler ended the transaction
		run.rollback(&d, m.wire)
		step = servercore.Step{Do: servercore.KeepUnreplayable, Status: plan.Status}
	}
	for {
		switch step.Do {
		case servercore.KeepUnreplayable:
			run.rollback(&d, m.wire) // whatever the handler left open
			err = h.mark(d.context(), c, step.Status)
			step = q.Marked(err)
		case servercore.Recheck:
			found, rerr := h.recheck(d.context(), c)
			if rerr != nil {
				m.logger.ErrorContext(ctx, "idemhttp/postgres: looking the key up again after a rollback failed", m.logKey(c.Key), "error", rerr)
			}
			var hdr http.Header
			if w != nil {
				hdr = w.Header()
			}
			var v servercore.Verdict
			// The run's token tells the core whether the row found is the
			// request's own claim row, which only the handler's own COMMIT
			// can have committed (then the key is kept, 410, and the
			// answer is 500, not 409).
			step, v = q.Rechecked(servercore.Claim{Err: rerr, Found: found, Fingerprint: c.fingerprint, Token: c.Token, Request: r, Body: c.body}, hdr)
			if step.Phase == servercore.Answered {
				m.logger.InfoContext(ctx, "idemhttp/postgres: rolled back; the key was taken meanwhile", m.logKey(c.Key), "cause", err)
				status := 0
				if w != nil {
					_, status = h.answer(w, r, c, v)
				}
				rep.released(idemserver.ReleaseReason(step.Reason), status)
				return false
			}
		default: // Done
			if step.Phase == servercore.Again {
				return true
			}
			h.finish(ctx, w, r, c, step, buf, rep, err)
			return false
		}
	}
}

// finish answers a request the core is done with, logs and reports.
func (h *txHandler) finish(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, step servercore.Step, buf *txWriter, rep *txReport, err error) {
	m := h.m
	status := step.Status
	switch step.Phase {
	case servercore.Stored:
		if step.Answer == servercore.AnswerTxEnded {
			m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself; answered 500, the key kept as not replayable", m.logKey(c.Key))
			rep.stored(status, false)
		} else {
			rep.stored(status, true)
		}
	case servercore.Released:
		switch step.Answer {
		case servercore.AnswerSerialization:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: serialization failure; rolled back, answered 503", m.logKey(c.Key), "error", err)
			status = http.StatusServiceUnavailable
		case servercore.AnswerTooLarge:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: response too large to store; rolled back", m.logKey(c.Key), "limit", m.maxStored)
		case servercore.AnswerInProgress:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: claim lost; rolled back", m.logKey(c.Key))
		case servercore.AnswerRolledBack:
			if step.Reason != servercore.ReasonPanic && step.Reason != servercore.ReasonCanceled {
				m.logger.ErrorContext(ctx, "idemhttp/postgres: rolled back", m.logKey(c.Key), "status", status, "error", err)
			}
		}
		rep.released(idemserver.ReleaseReason(step.Reason), status)
	default: // Unsettled
		if step.Answer == servercore.AnswerTxEnded {
			m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself, and keeping its key failed", m.logKey(c.Key), "error", err)
			rep.storeError(idemserver.StoreOpComplete, http.StatusInternalServerError, err)
		} else {
			m.logger.ErrorContext(ctx, "idemhttp/postgres: commit outcome unknown; answered 503", m.logKey(c.Key), "error", err)
			rep.storeError(idemserver.StoreOpComplete, http.StatusServiceUnavailable, err)
		}
	}
	if w == nil {
		return // a panic: nothing is answered
	}
	switch step.Answer {
	case servercore.AnswerSend:
		buf.send(w, m.at)
	case servercore.AnswerRolledBack:
		m.writeError(w, r, problemRolledBack(c.Key))
	case servercore.AnswerTooLarge:
		m.writeError(w, r, problemResponseTooLarge(c.Key, m.maxStored))
	case servercore.AnswerTxEnded:
		m.writeError(w, r, problemTxEnded(c.Key))
	case servercore.AnswerSerialization:
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, problemSerializationFailure(c.Key))
	case servercore.AnswerInProgress:
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemInProgress(m.header, c.Key))
	default: // AnswerUnknown
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemStoreUnavailable(c.Key))
	}
}

// answer answers a request as the core's verdict on its claim says: 422
// for another request's key, 409 while it runs, the stored response (its
// header already set) or 410 when it completed, 503 when the database
// could not say. It returns the claim's outcome and the status answered.
func (h *txHandler) answer(w http.ResponseWriter, r *http.Request, c *txClaim, v servercore.Verdict) (idemserver.ClaimOutcome, int) {
	m := h.m
	switch v.Answer {
	case servercore.AnswerMismatch:
		m.writeError(w, r, idemserver.ProblemKeyMismatch(m.header, c.Key))
		return idemserver.ClaimMismatch, http.StatusUnprocessableEntity
	case servercore.AnswerInProgress:
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemInProgress(m.header, c.Key))
		return idemserver.ClaimInProgress, http.StatusConflict
	case servercore.AnswerNotReplayable:
		m.writeError(w, r, idemserver.ProblemNotReplayable(m.header, c.Key, v.Status))
		return idemserver.ClaimNotReplayable, http.StatusGone
	case servercore.AnswerReplay:
		hdr := w.Header()
		hdr.Set(idemserver.ReplayedHeader, "true")
		hdr.Set("Content-Length", strconv.Itoa(len(v.Body)))
		w.WriteHeader(v.Status)
		_, _ = w.Write(v.Body) // a failed write means the client left
		return idemserver.ClaimReplay, v.Status
	case servercore.AnswerCorrupt:
		m.logger.ErrorContext(r.Context(), "idemhttp/postgres: corrupt stored response; answered 503", m.logKey(c.Key), "error", v.Err)
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemStoreUnavailable(c.Key))
		return idemserver.ClaimReplay, 0
	}
	// AnswerStoreFailed (or full, which a database does not say)
	m.logger.ErrorContext(r.Context(), "idemhttp/postgres: begin or claim failed; answered 503", m.logKey(c.Key), "error", v.Err)
	w.Header().Set("Retry-After", m.retryAfter)
	m.writeError(w, r, idemserver.ProblemStoreUnavailable(c.Key))
	return "", http.StatusServiceUnavailable
}

// mark keeps the key of a run whose handler ended the transaction itself
// as completed, not replayable (a retry gets 410), since some of its
// writes may have committed without the record: over its own claim row,
// which the handler's COMMIT may have committed.
func (h *txHandler) mark(ctx context.Context, c *txClaim, status int) error {
	m := h.m
	return retry(ctx, func() error {
		_, err := m.db.Exec(ctx, m.sql.mark, c.row, c.token(), c.fpBytes(), servercore.Unreplayable(status), m.ttl)
		return err
	})
}

// newToken returns a claim token unique to this process and run.
func (m *TxMiddleware) newToken() string {
	return string(strconv.AppendUint([]byte(m.tokenPrefix), m.tokens.Add(1), 36))
}

// serveKeyless runs a request without a key in a transaction of its own,
// committed unless the handler fails or answers 5xx. No key, no claim:
// the core has nothing to decide. A handler that ends the transaction
// itself gets 500.
func (h *txHandler) serveKeyless(w http.ResponseWriter, r *http.Request) {
	m := h.m
	ctx := context.WithoutCancel(r.Context())
	cd := newDBStep(r.Context(), m.dbTimeout)
	run, _, err := h.claim(&cd, nil)
	cd.done()
	if err != nil {
		m.logger.ErrorContext(ctx, "idemhttp/postgres: begin failed; answered 503", "error", err)
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemStoreUnavailable(""))
		return
	}
	defer func() { // a panic's; nothing once committed
		d := newDBStep(ctx, m.dbTimeout)
		run.rollback(&d, m.wire)
		d.done()
	}()
	buf := &txWriter{header: make(http.Header), limit: m.maxStored}
	herr := h.next.ServeHTTPTx(buf, r, &run.lent)
	run.lent.close()
	h.step("handler")
	status := buf.finalStatus()
	d := newDBStep(ctx, m.dbTimeout)
	defer d.done()
	switch {
	case run.state() == servercore.TxIdle:
		run.rollback(&d, m.wire)
		m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself; answered 500")
		m.writeError(w, r, problemTxEnded(""))
	case herr != nil || buf.overflow || buf.switched || status >= 500 || status < 100 || status > 999:
		run.rollback(&d, m.wire)
		switch {
		case herr != nil:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: handler failed; rolled back", "error", herr)
			m.writeError(w, r, problemRolledBack(""))
		case buf.overflow:
			m.writeError(w, r, problemResponseTooLarge("", m.maxStored))
		case status < 500:
			m.writeError(w, r, problemRolledBack(""))
		default:
			buf.send(w, nil)
		}
	default:
		switch outcome, err := run.commit(&d, m, nil, nil, h.step); outcome {
		case servercore.CommitOK:
			h.step("after-commit")
			buf.send(w, m.at)
		case servercore.CommitUnknown:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: commit outcome unknown; answered 503", "error", err)
			w.Header().Set("Retry-After", m.retryAfter)
			m.writeError(w, r, idemserver.ProblemStoreUnavailable(""))
		default:
			m.logger.ErrorContext(ctx, "idemhttp/postgres: commit refused; rolled back", "error", err)
			m.writeError(w, r, problemRolledBack(""))
		}
	}
}
