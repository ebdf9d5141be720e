//go:build go1.26

package sim

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idemhttp/internal/servermodel"
)

// The transactional world (shellTx): each server process is a
// servermodel.TxServer, the server core in its Transactional mode with
// TxMiddleware's steps, over the one modelled database, on connections of
// its own (its pool, which its crash drops: the database rolls back what
// they had open). The handler's charge is written in the request's
// transaction, and commits with the stored response or not at all.

// txShell returns server process p's shell.
func (w *world) txShell(p *serverProc) http.Handler {
	s := &servermodel.TxServer{
		DB:      w.ledger.database(),
		Handler: p.txCharge,
		Timeout: dbTimeout,
		Pool:    p.pool(),
		Faults:  p.dbFault,

		MaxStoredBody:        maxStored,
		SerializationRetries: 1,
	}
	if w.cfg.Tenants >= 2 {
		s.Principal = principal
	}
	return s
}

// errBusiness is a handler's own failure: its transaction rolls back.
var errBusiness = errors.New("sim: the business failed")

// dbFault is the fault of a statement of p's shell: none for a dead
// process's (its connections are gone: the database refuses them
// itself), the store's faults otherwise, and a crash of p just before its
// COMMIT (nothing committed).
func (p *serverProc) dbFault(op servermodel.Op, key string) servermodel.Fault {
	w := p.w
	if p.dead.Load() {
		return servermodel.Refuse
	}
	if op == servermodel.OpComplete {
		w.mu.Lock()
		w.commits[key]++
		n := w.commits[key]
		w.mu.Unlock()
		if w.serverPoint(p, "commit.before", fmt.Sprint(key, " ", n)) {
			return servermodel.Refuse
		}
	}
	return w.storeFault(op, key)
}

// txCharge is the business handler of the transactional world: it charges
// in the request's transaction, and then does what the seed says
// (behaviour).
func (p *serverProc) txCharge(rw http.ResponseWriter, r *http.Request, tx *servermodel.HandlerTx) error {
	w := p.w
	op, ok := opOfRequest(r)
	key, storeKey, kok := w.requestKey(r)
	if !ok || !kok {
		http.Error(rw, "bad request", http.StatusBadRequest)
		return nil
	}
	name := run(r)
	if w.serverPoint(p, "handler.start", name) || w.pause(p, op, key, name) {
		return errServerGone
	}
	b := w.behaviour(p, op, key, name)
	e := &effect{op: op, key: key, storeKey: storeKey, server: p.n, at: time.Now()}
	w.ledger.newCharge(e)
	if b == behBig {
		big(e)
	}
	if bugSplitCommit {
		// The charge commits at once, outside the transaction the
		// response is stored in.
		w.ledger.database().Write(storeKey, e.charge)
	} else if err := tx.Effect(e.charge); err != nil {
		return err // the connection is gone
	}
	if w.serverPoint(p, "handler.effect", name) {
		return errServerGone
	}
	switch b {
	case behFail:
		return errBusiness
	case behSerialize:
		return fmt.Errorf("sim: %w", servermodel.ErrSerialization)
	case behPanic:
		panic(http.ErrAbortHandler)
	case behAbort:
		_ = tx.Fail()
	case behCommit, behChain:
		if b == behCommit {
			tx.Commit()
		} else {
			tx.CommitAndChain()
		}
		w.mu.Lock()
		w.selfCommitted[storeKey] = true
		w.mu.Unlock()
		if w.serverPoint(p, "handler.committed", name) {
			return errServerGone
		}
	case behGiveUp:
		<-r.Context().Done() // its client left: a timeout, a reset, or the process's end
		return nil
	case behCharge:
		if w.hijacks(name) { // hijack.go
			if w.draw(2, "hijack how", name) == 0 {
				p.switchProtocols(rw, e)
				return nil
			}
			if p.hijackRespond(rw, e) {
				return nil
			}
		}
	}
	w.respond(rw, e)
	return nil
}
