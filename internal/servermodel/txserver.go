package servermodel

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/servercore"
)

// TxServer is the transactional shell over a [DB]: the server core in
// Transactional mode, with TxMiddleware's steps mapped onto the model.
// Every keyed POST runs Handler in a transaction whose claim row and lock
// hold the key; the response is buffered and sent after the commit.
// Requests of other methods, and without a key, get 400 (the model serves
// keyed requests only).
//
// Set the fields before the first request; it is safe for concurrent use
// then.
type TxServer struct {
	DB *DB
	// Handler serves a request in its transaction; returning an error
	// rolls it back.
	Handler func(w http.ResponseWriter, r *http.Request, tx *HandlerTx) error
	// Principal returns a request's scope; nil means a single tenant.
	Principal func(r *http.Request) string
	// TTL keeps records; zero means idemserver.DefaultTTL.
	TTL time.Duration
	// Timeout bounds each of the shell's own statements (TxMiddleware's
	// DBTimeout); zero means idemserver.DefaultLockTimeout.
	Timeout time.Duration
	// MaxStoredBody bounds the response; zero means
	// idemserver.DefaultMaxStoredBody.
	MaxStoredBody int
	// SerializationRetries is the core's; the model has no serialization
	// failures, so it matters only to a Handler that reports one
	// ([ErrSerialization]).
	SerializationRetries int
	// Observe, when set, is told of each of the core's moves.
	Observe func(from, to servercore.Phase, ok bool)
	// Pool names the connections this server opens, so that [DB.Drop]
	// can end them all, as a server process that dies ends its own (a
	// simulated world runs one TxServer per process on one DB); "" is a
	// pool of its own that is never dropped.
	Pool string
	// Faults, when set, decides the faults of this server's statements
	// instead of the DB's Faults (in a simulated world, a fault of one
	// server process's connections).
	Faults Faults

	tokens atomic.Uint64
}

// ErrSerialization is the error a Handler returns (wrapped or not) to
// model a serialization failure: the core may run it again.
var ErrSerialization = errors.New("servermodel: serialization failure")

func (s *TxServer) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return idemserver.DefaultTTL
}

func (s *TxServer) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return idemserver.DefaultLockTimeout
}

func (s *TxServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header["Idempotency-Key"]
	if r.Method != http.MethodPost || len(values) != 1 {
		idemserver.WriteProblem(w, idemserver.ProblemKeyMissing("Idempotency-Key"))
		return
	}
	key, err := idemserver.ParseKey(values[0], idemserver.KeyFormAny)
	if err != nil {
		idemserver.WriteProblem(w, idemserver.ProblemKeyInvalid("Idempotency-Key", err.Error()))
		return
	}
	body, err := idemserver.ReadBody(r, idemserver.DefaultMaxBodyBytes)
	if err != nil {
		idemserver.WriteProblem(w, idemserver.ProblemBodyUnreadable())
		return
	}
	scope := ""
	if s.Principal != nil {
		scope = s.Principal(r)
	}
	storeKey := idemserver.ScopedKey(scope, key)
	fp := idemserver.DefaultFingerprint(r, body)
	cfg := &servercore.Config{Mode: servercore.Transactional, DefaultFingerprint: true, SerializationRetries: s.SerializationRetries, Observe: s.Observe}
	q := cfg.Start()
	c := claimInfo{key: key, storeKey: storeKey, fp: fp, body: body}
	for {
		c.token = "model-" + strconv.FormatUint(s.tokens.Add(1), 36)
		cctx, cancel := context.WithTimeout(r.Context(), s.timeout())
		tx, locked, claimed, row, err := s.DB.claim(cctx, s.Pool, s.Faults, storeKey, c.token, fp, s.ttl())
		cancel()
		var found servercore.Found
		if err == nil {
			found, err = servercore.TxFound(locked, claimed, row)
		}
		v := q.Claimed(servercore.Claim{Err: err, Found: found, Fingerprint: fp, Request: r, Body: body}, w.Header())
		if v.Answer != servercore.AnswerRun {
			answer(w, key, v)
			return
		}
		// The handler reads the request's body, as TxMiddleware's does,
		// from the start on every run.
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !s.run(w, r, tx, &q, c) {
			return
		}
		q.Restart()
	}
}

type claimInfo struct {
	key, storeKey, fp, token string
	body                     []byte
}

// run runs the handler in tx and settles its end as the core decides; it
// returns true when the request runs again.
func (s *TxServer) run(w http.ResponseWriter, r *http.Request, tx *Tx, q *servercore.Request, c claimInfo) bool {
	ctx := context.WithoutCancel(r.Context())
	buf := &bufWriter{header: http.Header{}, limit: s.MaxStoredBody}
	if buf.limit <= 0 {
		buf.limit = idemserver.DefaultMaxStoredBody
	}
	htx := &HandlerTx{tx: tx}
	returned := false
	defer func() {
		if !returned {
			htx.close()
			plan := q.Returned(servercore.Handler{Panicked: true, Tx: tx.txState()})
			s.settle(ctx, nil, tx, q, plan, buf, c)
		}
	}()
	herr := s.Handler(buf, r, htx)
	htx.close()
	returned = true
	plan := q.Returned(servercore.Handler{
		Err:           herr,
		Serialization: errors.Is(herr, ErrSerialization),
		Wrote:         buf.wrote,
		Status:        buf.finalStatus(),
		Overflow:      buf.overflow,
		Hijacked:      buf.switched,
		ClientGone:    r.Context().Err() != nil,
		Tx:            tx.txState(),
	})
	return s.settle(ctx, w, tx, q, plan, buf, c)
}

// settle carries out the core's plan, as TxMiddleware's settle does.
func (s *TxServer) settle(ctx context.Context, w http.ResponseWriter, tx *Tx, q *servercore.Request, plan servercore.Plan, buf *bufWriter, c claimInfo) bool {
	dctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	var step servercore.Step
	switch plan.Do {
	case servercore.Keep:
		record := append(servercore.EncodeHead(plan.Status, buf.header, len(buf.body), nil), buf.body...)
		step = q.Committed(tx.commit(dctx, record))
	case servercore.Release:
		step = q.RolledBack(tx.end(dctx))
	default:
		tx.rollback()
		step = servercore.Step{Do: servercore.KeepUnreplayable, Status: plan.Status}
	}
	for {
		switch step.Do {
		case servercore.KeepUnreplayable:
			tx.rollback()
			step = q.Marked(s.DB.mark(dctx, s.Pool, s.Faults, c.storeKey, c.token, c.fp, servercore.Unreplayable(step.Status), s.ttl()))
		case servercore.Recheck:
			row, err := s.DB.lookup(dctx, s.Pool, s.Faults, c.storeKey)
			var hdr http.Header
			if w != nil {
				hdr = w.Header()
			}
			var v servercore.Verdict
			// The token tells the core whether the row is the request's
			// own claim row, which only the handler's COMMIT can have
			// committed.
			step, v = q.Rechecked(servercore.Claim{Err: err, Found: servercore.RowFound(row), Fingerprint: c.fp, Token: c.token}, hdr)
			if step.Phase == servercore.Answered {
				if w != nil {
					answer(w, c.key, v)
				}
				return false
			}
		default:
			if step.Phase == servercore.Again {
				return true
			}
			if w != nil {
				finish(w, c.key, step, buf)
			}
			return false
		}
	}
}

// answer answers a verdict on a claim, as the middlewares do.
func answer(w http.ResponseWriter, key string, v servercore.Verdict) {
	const header = "Idempotency-Key"
	switch v.Answer {
	case servercore.AnswerMismatch:
		idemserver.WriteProblem(w, idemserver.ProblemKeyMismatch(header, key))
	case servercore.AnswerInProgress:
		w.Header().Set("Retry-After", "1")
		idemserver.WriteProblem(w, idemserver.ProblemInProgress(header, key))
	case servercore.AnswerNotReplayable:
		idemserver.WriteProblem(w, idemserver.ProblemNotReplayable(header, key, v.Status))
	case servercore.AnswerReplay:
		w.Header().Set(idemserver.ReplayedHeader, "true")
		w.WriteHeader(v.Status)
		_, _ = w.Write(v.Body)
	default:
		w.Header().Set("Retry-After", "1")
		idemserver.WriteProblem(w, idemserver.ProblemStoreUnavailable(key))
	}
}

// The problem types of TxMiddleware, which the model answers too.
const (
	TypeRolledBack           = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeRolledBack"
	TypeResponseTooLarge     = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeResponseTooLarge"
	TypeTxEnded              = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeTxEnded"
	TypeSerializationFailure = "https://pkg.go.dev/github.com/idemkit/idemhttp/contrib/postgres#TypeSerializationFailure"
)

// finish answers a request the core is done with.
func finish(w http.ResponseWriter, key string, step servercore.Step, buf *bufWriter) {
	problem := func(typ string, status int) {
		idemserver.WriteProblem(w, &idemserver.Problem{Type: typ, Status: status, Key: key})
	}
	switch step.Answer {
	case servercore.AnswerSend:
		for k, vs := range buf.header {
			w.Header()[k] = vs
		}
		w.WriteHeader(buf.finalStatus())
		_, _ = w.Write(buf.body)
	case servercore.AnswerRolledBack:
		problem(TypeRolledBack, http.StatusInternalServerError)
	case servercore.AnswerTooLarge:
		problem(TypeResponseTooLarge, http.StatusInternalServerError)
	case servercore.AnswerTxEnded:
		problem(TypeTxEnded, http.StatusInternalServerError)
	case servercore.AnswerSerialization:
		w.Header().Set("Retry-After", "1")
		problem(TypeSerializationFailure, http.StatusServiceUnavailable)
	case servercore.AnswerInProgress:
		w.Header().Set("Retry-After", "1")
		idemserver.WriteProblem(w, idemserver.ProblemInProgress("Idempotency-Key", key))
	default:
		w.Header().Set("Retry-After", "1")
		idemserver.WriteProblem(w, idemserver.ProblemStoreUnavailable(key))
	}
}

// bufWriter buffers a handler's response until the commit.
type bufWriter struct {
	header   http.Header
	status   int
	body     []byte
	limit    int
	overflow bool
	wrote    bool
	switched bool // the handler answered 101 Switching Protocols, as contrib/postgres's txWriter records
}

func (b *bufWriter) Header() http.Header { return b.header }

func (b *bufWriter) WriteHeader(code int) {
	// 101 cannot wait for the commit: the request is rolled back, as
	// TxMiddleware's (the connection cannot be hijacked either: this
	// writer is no http.Hijacker).
	if code == http.StatusSwitchingProtocols {
		b.switched = true
	}
	if b.wrote || (code >= 100 && code <= 199) {
		return
	}
	b.wrote, b.status = true, code
}

func (b *bufWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if !b.overflow {
		if len(b.body)+len(p) > b.limit {
			b.overflow, b.body = true, nil
		} else {
			b.body = append(b.body, p...)
		}
	}
	return len(p), nil
}

func (b *bufWriter) finalStatus() int {
	if !b.wrote {
		return http.StatusOK
	}
	return b.status
}
