package postgres

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemhttp/idemserver"
)

// serve runs one request in a transaction; c is nil for a request without
// a key. A keyed request whose transaction ends in a serialization failure
// or a deadlock runs again, in a new transaction, up to
// TxOptions.SerializationRetries times.
func (h *txHandler) serve(w http.ResponseWriter, r *http.Request, c *txClaim) {
	m := h.m
	// The work must be finished and recorded even when the client leaves;
	// a rollback then would only make its retry run the request again.
	ctx := context.WithoutCancel(r.Context())
	key := claimKey(c)
	rep := h.reporter(r, c)
	for attempt := 0; ; attempt++ {
		run, outcome, res, err := h.begin(ctx, c)
		if attempt == 0 {
			rep.claimed()
		}
		if err != nil {
			m.logger.ErrorContext(ctx, "idemhttp/postgres: begin or claim failed; answered 503", "key", key, "error", err)
			w.Header().Set("Retry-After", m.retryAfter)
			m.writeError(w, r, idemserver.ProblemStoreUnavailable(key))
			rep.storeError(idemserver.StoreOpClaim, http.StatusServiceUnavailable, err)
			return
		}
		if outcome != claimRun {
			o, status := h.answer(w, r, c, outcome, res)
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
		if !h.runOnce(ctx, w, r, c, run, &rep, attempt < m.retries) {
			return
		}
		// Run again, as a new run of the key, with the body from the start.
		m.logger.InfoContext(ctx, "idemhttp/postgres: serialization failure; running the request again", "key", key, "attempt", attempt+1)
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

// runOnce runs the handler in run, an open transaction that (for a keyed
// request) holds the key, and answers; it returns true instead when the
// transaction failed by a serialization failure or a deadlock, canRetry
// is set and the key is still free: then nothing was answered and the
// caller runs the request again.
func (h *txHandler) runOnce(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, run *txRun, rep *txReport, canRetry bool) (again bool) {
	m := h.m
	key := claimKey(c)
	if c != nil {
		r = r.WithContext(context.WithValue(r.Context(), txKeyContext{}, c.TxKey))
	}
	// Every path that does not commit rolls back, a panic's too: the
	// deferred rollback runs before the panic continues to net/http.
	defer func() {
		if run.closed {
			return // committed or rolled back, and reported
		}
		if run.end(ctx) {
			h.markEnded(ctx, run, c, 0, rep)
			return
		}
		rep.panicked()
	}()
	buf := &txWriter{header: make(http.Header), limit: m.maxStored}
	herr := h.next.ServeHTTPTx(buf, r, run.lent)
	run.lent.close() // nothing more through it, from a goroutine the handler left either
	h.step("handler")
	status := buf.finalStatus()
	commit := status < 500
	if c != nil {
		commit = m.shouldStore(status)
	}
	aborted := run.aborted()
	if herr != nil || buf.overflow || buf.switched || !commit || aborted || run.escaped() {
		if run.end(ctx) {
			// The handler ended the transaction itself (COMMIT or
			// ROLLBACK, through the transaction or its connection),
			// whatever it then returned or answered: what it committed
			// is unknown.
			h.ended(ctx, w, r, run, c, status, rep)
			return false
		}
	}
	switch {
	case herr != nil:
		return h.rolledBack(ctx, w, r, c, rep, status, herr, canRetry,
			"idemhttp/postgres: handler failed; rolled back", "error", herr)
	case buf.overflow:
		m.logger.ErrorContext(ctx, "idemhttp/postgres: response too large to store; rolled back", "key", key, "limit", m.maxStored)
		m.writeError(w, r, problemResponseTooLarge(key, m.maxStored))
		rep.released(idemserver.ReleaseNotStorable, status)
		return false
	case buf.switched:
		// Nothing may reach the client before the commit, and a switch of
		// protocols cannot be stored: roll back, so that nothing ran.
		m.logger.ErrorContext(ctx, "idemhttp/postgres: handler answered 101 Switching Protocols, which cannot wait for the commit; rolled back", "key", key)
		m.writeError(w, r, problemRolledBack(key))
		rep.released(idemserver.ReleaseNotStorable, http.StatusSwitchingProtocols)
		return false
	case aborted && commit:
		// A statement failed and the handler answered anyway: nothing
		// could commit.
		return h.rolledBack(ctx, w, r, c, rep, status, errAborted, false,
			"idemhttp/postgres: a statement failed and the handler went on; rolled back", "status", status)
	case !commit:
		// Not stored, so a retry runs the request again: its writes must
		// not stay.
		buf.send(w, nil)
		if status >= 500 {
			rep.released(idemserver.ReleaseServerError, status)
		} else {
			rep.released(idemserver.ReleaseNotStored, status)
		}
		return false
	}
	var record []byte
	if c != nil {
		var err error
		record, err = (&idemserver.Response{Status: status, Header: storedHeader(buf.header), Body: buf.body}).MarshalBinary()
		if err != nil { // a status outside 100-999: net/http would panic on it
			if run.end(ctx) {
				h.ended(ctx, w, r, run, c, status, rep)
				return false
			}
			m.logger.ErrorContext(ctx, "idemhttp/postgres: response not storable; rolled back", "key", key, "error", err)
			m.writeError(w, r, problemRolledBack(key))
			rep.released(idemserver.ReleaseNotStorable, status)
			return false
		}
	}
	h.step("before-commit")
	err := run.commit(ctx, c, record, m.ttl, h.step)
	if err == nil {
		h.step("after-commit")
		buf.send(w, h.m.at)
		if c != nil {
			rep.stored(status, true)
		} else {
			rep.done = true
		}
		return false
	}
	// Whatever happened, a retry with the same key is safe: the record
	// rides the same commit as the writes, so it finds both or neither.
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, errTxEnded):
		// Seen by the statement before the store: the handler ended the
		// transaction and began another.
		h.ended(ctx, w, r, run, c, status, rep)
		return false
	case errors.Is(err, errClaimLost):
		if again, done := h.afterRollback(ctx, w, r, c, rep, err, false); done {
			return again
		}
		// The claim is gone: whoever holds the key now may run the
		// request, so this run's writes did not commit.
		m.logger.ErrorContext(ctx, "idemhttp/postgres: claim lost; rolled back", "key", key)
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemInProgress(m.header, key))
		rep.released(idemserver.ReleaseClaimLost, status)
		return false
	case errors.As(err, &pgErr):
		return h.rolledBack(ctx, w, r, c, rep, status, err, canRetry,
			"idemhttp/postgres: commit refused; rolled back", "error", err)
	}
	m.logger.ErrorContext(ctx, "idemhttp/postgres: commit outcome unknown; answered 503", "key", key, "error", err)
	w.Header().Set("Retry-After", m.retryAfter)
	m.writeError(w, r, idemserver.ProblemStoreUnavailable(key))
	rep.storeError(idemserver.StoreOpComplete, http.StatusServiceUnavailable, err)
	return false
}

// claimKey returns c's key, or "" for a request without one (c nil).
func claimKey(c *txClaim) string {
	if c == nil {
		return ""
	}
	return c.Key
}

// ended answers a run whose handler ended the transaction itself: the key
// kept as not replayable (see markEnded), and 500.
func (h *txHandler) ended(ctx context.Context, w http.ResponseWriter, r *http.Request, run *txRun, c *txClaim, status int, rep *txReport) {
	h.markEnded(ctx, run, c, status, rep)
	h.m.writeError(w, r, problemTxEnded(claimKey(c)))
}

// rolledBack answers a run whose transaction rolled back because of
// cause, after the handler answered status: what afterRollback answers
// when it does (returning again), else, logged as msg with the key and
// attrs, the plain failure answer (500, [TypeRolledBack]).
func (h *txHandler) rolledBack(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, rep *txReport, status int, cause error, canRetry bool, msg string, attrs ...any) bool {
	if again, done := h.afterRollback(ctx, w, r, c, rep, cause, canRetry); done {
		return again
	}
	key := claimKey(c)
	h.m.logger.ErrorContext(ctx, msg, append([]any{"key", key}, attrs...)...)
	h.m.writeError(w, r, problemRolledBack(key))
	rep.released(idemserver.ReleaseRolledBack, status)
	return false
}

// errAborted stands for a transaction found aborted after the handler.
var errAborted = errors.New("transaction aborted")

// afterRollback answers a keyed request whose transaction has rolled back
// because of cause, when something other than the plain failure answer is
// due, and then reports done:
//
//   - when the key has been completed (or claimed by a Store) since: the
//     stored response, or 409 or 422, as a duplicate would get. Under
//     REPEATABLE READ and SERIALIZABLE the transaction's snapshot is taken
//     before the key's lock is (the statement that takes the lock takes
//     the snapshot first), so a duplicate that took the lock as the first
//     run committed does not see that run's row: its writes or its store
//     then fail (a unique violation, a serialization failure), and the row
//     is there to be found afresh. Under READ COMMITTED the same happens
//     when a Store sharing the table completes the key meanwhile;
//   - for a serialization failure or a deadlock: again (nothing answered)
//     when canRetry, else 503 with Retry-After ([TypeSerializationFailure]):
//     nothing committed and the key is free.
func (h *txHandler) afterRollback(ctx context.Context, w http.ResponseWriter, r *http.Request, c *txClaim, rep *txReport, cause error, canRetry bool) (again, done bool) {
	if c == nil {
		return false, false
	}
	m := h.m
	outcome, res, err := h.recheck(ctx, c)
	switch {
	case err != nil:
		m.logger.ErrorContext(ctx, "idemhttp/postgres: looking the key up again after a rollback failed", "key", c.Key, "error", err)
	case outcome != claimRun:
		m.logger.InfoContext(ctx, "idemhttp/postgres: rolled back; the key was taken meanwhile", "key", c.Key, "cause", cause)
		_, status := h.answer(w, r, c, outcome, res)
		reason := idemserver.ReleaseRolledBack
		if errors.Is(cause, errClaimLost) {
			reason = idemserver.ReleaseClaimLost
		}
		rep.released(reason, status)
		return false, true
	}
	conflict := serializationFailure(cause)
	if !conflict {
		return false, false
	}
	if canRetry {
		return true, true
	}
	m.logger.ErrorContext(ctx, "idemhttp/postgres: serialization failure; rolled back, answered 503", "key", c.Key, "error", cause)
	w.Header().Set("Retry-After", m.retryAfter)
	m.writeError(w, r, problemSerializationFailure(c.Key))
	rep.released(idemserver.ReleaseRolledBack, http.StatusServiceUnavailable)
	return false, true
}

// serializationFailure reports whether err is PostgreSQL's
// serialization_failure (40001) or deadlock_detected (40P01): the
// transaction rolled back because of others running at the same time, and
// running it again may succeed.
func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// answer answers a keyed request that found its key taken: 422 for
// another request's key, 409 while it runs, the stored response when it
// completed. It returns the claim's outcome and the status answered.
func (h *txHandler) answer(w http.ResponseWriter, r *http.Request, c *txClaim, outcome claimOutcome, res idemserver.ClaimResult) (idemserver.ClaimOutcome, int) {
	m := h.m
	switch {
	case res.Fingerprint != "" && res.Fingerprint != c.fingerprint:
		// As idemserver does: another request's key is 422 whether that
		// request has finished (a stored response) or not (a Store's
		// claim; a running TxMiddleware request's fingerprint is unknown
		// until it commits).
		m.writeError(w, r, idemserver.ProblemKeyMismatch(m.header, c.Key))
		return idemserver.ClaimMismatch, http.StatusUnprocessableEntity
	case outcome == claimBusy:
		w.Header().Set("Retry-After", m.retryAfter)
		m.writeError(w, r, idemserver.ProblemInProgress(m.header, c.Key))
		return idemserver.ClaimInProgress, http.StatusConflict
	}
	return h.replay(w, r, c.Key, res.Record)
}

// markEnded handles a run whose handler ended the transaction itself:
// whatever it left open on the connection rolls back, and, for a keyed
// request, the key is kept as completed but not replayable (a retry gets
// 410), since some of the handler's writes may have committed without the
// record. The caller answers.
func (h *txHandler) markEnded(ctx context.Context, run *txRun, c *txClaim, status int, rep *txReport) {
	m := h.m
	run.rollback(ctx)
	if c == nil {
		m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself; answered 500")
		rep.done = true
		return
	}
	err := retry(ctx, func() error {
		_, err := m.db.Exec(ctx, storeTxSQL, c.row, []byte(c.Token), []byte(c.fingerprint), idemserver.NotReplayableRecord(status), m.ttl)
		return err
	})
	if err != nil {
		m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself, and keeping its key failed; a retry may run it again", "key", c.Key, "error", err)
		rep.storeError(idemserver.StoreOpComplete, http.StatusInternalServerError, err)
		return
	}
	m.logger.ErrorContext(ctx, "idemhttp/postgres: the handler ended the transaction itself; answered 500, the key kept as not replayable", "key", c.Key)
	rep.stored(status, false)
}

// newToken returns a claim token unique to this process and run.
func (m *TxMiddleware) newToken() string {
	return string(strconv.AppendUint([]byte(m.tokenPrefix), m.tokens.Add(1), 36))
}
