//go:build go1.26

package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/idemkit/idemhttp"
)

// The invariants' checks. 5 to 8 look at a journal as a process opens it
// (after every crash) and at the end; the others at the whole run's
// calls and the ledger, at the end.

// entries returns what p's journal holds, read directly (no turns: the
// driver reads it, as the process starts or after the run).
func (w *world) entries(p *clientProc) ([]*idemhttp.Entry, error) {
	if w.fleet != nil {
		return w.fleet.Entries(), nil
	}
	if p.j == nil {
		return nil, errors.New("no journal")
	}
	return p.j.Entries(context.Background())
}

// checkJournal checks the journal process p just opened: every
// Begin acknowledged is there (5), no secret is in it (6), every done
// entry's effect exists (7), and every entry once found done is still
// done (8). It keeps what it read for the job (queueFor).
func (w *world) checkJournal(p *clientProc) {
	es, err := w.entries(p)
	if err != nil {
		w.failKnown(invJournal, -1, w.cacheKnown(), "client %d: the journal's entries cannot be read: %v", p.n, err)
		return
	}
	p.scan = map[string]idemhttp.State{}
	for _, e := range es {
		p.scan[e.Key] = e.State
	}
	for _, k := range w.acks.mustHave() {
		if _, ok := p.scan[k]; !ok {
			w.failKnown(invJournal, w.opOfKey(k), w.cacheKnown(), "client %d: acknowledged Begin of key %s is missing after the crash", p.n, k)
		}
	}
	w.checkDone(fmt.Sprintf("client %d's journal", p.n), es)
	w.checkSecrets(es)
}

// checkDone checks invariants 7 and 8 on es, a journal's entries.
func (w *world) checkDone(where string, es []*idemhttp.Entry) {
	state := map[string]*idemhttp.Entry{}
	for _, e := range es {
		state[e.Key] = e
		if e.State != idemhttp.StateDone {
			continue
		}
		if len(w.ledger.byKey(e.Key)) == 0 && !w.classifierFinal(e.LastStatus) {
			op := w.opOfKey(e.Key)
			w.failKnown(invDone, op, w.doneKnown(op, e.LastStatus), "%s holds key %s done (status %d), and the server never ran it", where, e.Key, e.LastStatus)
		}
	}
	keys := make([]string, 0, len(w.everDone))
	for k := range w.everDone {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch e := state[k]; {
		case e == nil:
			w.fail(invDoneStay, w.opOfKey(k), "%s lost key %s, found done before", where, k)
		case e.State != idemhttp.StateDone:
			w.fail(invDoneStay, w.opOfKey(k), "%s holds key %s %s, found done before", where, k, e.State)
		}
	}
	for _, e := range es {
		if e.State == idemhttp.StateDone {
			w.everDone[e.Key] = true
		}
	}
}

// checkSecrets looks for the requests' secrets in every file of every
// disk (the journal, torn tails kept aside, index files) and in every
// entry of the fleet's journal (invariant 6).
func (w *world) checkSecrets(es []*idemhttp.Entry) {
	for _, m := range w.machines {
		if m.disk == nil {
			continue
		}
		for _, name := range m.disk.Names() {
			b, err := m.disk.ReadFile(name)
			if err != nil {
				continue
			}
			for _, s := range secrets {
				if strings.Contains(string(b), s) {
					w.fail(invSecret, -1, "file %s of %v holds %s", name, m, s)
				}
			}
		}
	}
	if w.fleet == nil {
		return
	}
	for _, e := range es {
		text := fmt.Sprint(e.URL, e.Header, string(e.Body))
		if e.Result != nil {
			text += fmt.Sprint(e.Result.Header, string(e.Result.Body))
		}
		for _, s := range secrets {
			if strings.Contains(text, s) {
				w.fail(invSecret, w.opOfKey(e.Key), "the fleet's journal holds %s in entry %s", s, e.Key)
			}
		}
	}
}

// mintedKey records a key the client minted for unnamed operation op, as
// a job that logs its keys from the journal's hook does.
func (w *world) mintedKey(op int, key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.Contains(w.opKeys[op], key) {
		w.opKeys[op] = append(w.opKeys[op], key)
	}
	w.keyOp[key] = op
}

// queueFor is the batch p runs: its machine's named operations, and
// those unnamed ones that are still open: no answer settled them, and
// none of their keys is in the journal (an operation the journal holds
// is Resume's to resend; one it does not hold was never sent, or the job
// would have run it twice).
func (w *world) queueFor(p *clientProc) []int {
	var q []int
	for _, op := range p.m.ops {
		if w.opNamed[op] {
			q = append(q, op)
			continue
		}
		if w.final[op] {
			continue
		}
		w.mu.Lock()
		keys := slices.Clone(w.opKeys[op])
		w.mu.Unlock()
		held := false
		for _, k := range keys {
			if _, ok := p.scan[k]; ok {
				held = true
			}
		}
		if !held && !slices.Contains(q, op) {
			q = append(q, op)
		}
	}
	return q
}

// resolved reports whether every operation got a final outcome: a named
// one in the runs now going (the last round's, which reran the batch), an
// unnamed one ever, or an entry of its own done or abandoned.
func (w *world) resolved() bool {
	return len(w.unresolved()) == 0
}

// unresolved returns the operations not resolved, each with its last
// outcome in the runs now going.
func (w *world) unresolved() map[int]string {
	final := make([]bool, w.cfg.Ops)
	last := make([]string, w.cfg.Ops)
	live := map[*clientProc]bool{}
	for _, m := range w.machines {
		live[m.cli] = true
	}
	calls := w.returnedCalls()
	refused := false // a claim refused for a clock set back: every pending entry is a person's to decide
	for _, c := range calls {
		if !live[c.p] || c.zombie || c.compact {
			continue
		}
		if c.resume {
			refused = refused || errors.Is(c.resumeErr, idemhttp.ErrClockJump)
			for _, r := range c.results {
				if op := w.opOfKey(r.Entry.Key); op >= 0 && op < len(final) && r.Err == nil && classifyStatus(r.StatusCode).final() {
					final[op] = true
				}
			}
			continue
		}
		last[c.op] = c.class.String() + errText(c.err)
		if c.class.final() || w.classifierCaused(c) {
			final[c.op] = true
		}
	}
	var es []*idemhttp.Entry
	if p := w.machines[0].cli; p != nil {
		es, _ = w.entries(p)
	}
	out := map[int]string{}
	for op, f := range final {
		if f || !w.opNamed[op] && (w.final[op] || refused || w.settledInJournal(op, es)) {
			continue
		}
		out[op] = last[op]
	}
	return out
}

// settledInJournal reports whether an entry of unnamed operation op is
// done or abandoned in es.
func (w *world) settledInJournal(op int, es []*idemhttp.Entry) bool {
	w.mu.Lock()
	keys := slices.Clone(w.opKeys[op])
	w.mu.Unlock()
	for _, e := range es {
		if slices.Contains(keys, e.Key) && e.State != idemhttp.StatePending {
			return true
		}
	}
	return false
}

// checkEnd checks invariants 1 to 4, 6, 7 and 8 over the whole run.
func (w *world) checkEnd() {
	var es []*idemhttp.Entry
	if p := w.machines[0].cli; p != nil {
		var err error
		if es, err = w.entries(p); err == nil {
			w.checkDone("the journal at the end", es)
		}
	}
	w.checkSecrets(es)
	calls := w.returnedCalls()
	for op := range w.cfg.Ops {
		if es := w.ledger.of(op); len(es) > 1 {
			var keys []string
			for _, e := range es {
				keys = append(keys, e.key+"="+e.charge)
			}
			w.failOnce(invOnce, op, "op %d has %d effects: %s", op, len(es), strings.Join(keys, ", "))
		}
	}
	success := func(who string, op int, body []byte) {
		es := w.ledger.of(op)
		if len(es) != 1 {
			w.failOnce(invSuccess, op, "%s reported op %d successful, and it has %d effects", who, op, len(es))
			return
		}
		if string(body) != string(es[0].body) {
			w.fail(invSuccess, op, "%s got %s for op %d; the server first produced %s", who, body, op, es[0].body)
		}
	}
	for _, c := range calls {
		if c.zombie || c.compact {
			continue
		}
		if c.resume {
			for _, r := range c.results {
				if r.Err == nil && r.StatusCode/100 == 2 {
					success(fmt.Sprintf("call %d (resume)", c.id), w.opOfKey(r.Entry.Key), decoded(r.Header, r.Body))
				}
			}
			continue
		}
		switch c.class {
		case outSuccess:
			success(fmt.Sprintf("call %d", c.id), c.op, c.body)
		case outNotKept:
			// The server says it ran, and kept no response: it has its
			// effect, once.
			if es := w.ledger.of(c.op); len(es) != 1 {
				w.failOnce(invSuccess, c.op, "call %d got 410 for op %d (it ran, its response not kept), and it has %d effects", c.id, c.op, len(es))
			}
		case outDone:
			var done *idemhttp.DoneError
			if errors.As(c.err, &done) && (done.Status/100 == 2 || done.Status == http.StatusGone) {
				if es := w.ledger.of(c.op); len(es) != 1 {
					w.failOnce(invSuccess, c.op, "call %d: op %d is done with status %d, and it has %d effects", c.id, c.op, done.Status, len(es))
				}
			}
		case outNotSent:
			c.mu.Lock()
			keys := append([]string{c.key}, c.keys...)
			c.mu.Unlock()
			slices.Sort(keys)
			for _, k := range slices.Compact(keys) {
				if k == "" {
					continue
				}
				if es := w.ledger.byKey(k); len(es) > 0 {
					w.failKnown(invNotSent, c.op, w.notSentKnown(c), "call %d of op %d reported not sent (%s), and key %s has the effect %s", c.id, c.op, errText(c.err), k, es[0].charge)
				}
			}
		}
	}
	open := w.unresolved()
	for op := range w.cfg.Ops {
		if f, ok := open[op]; ok && !w.heldByServer(op) {
			w.failKnown(invLost, op, w.lostKnown(op), "after the recovery, op %d was last %s", op, f)
			break
		}
	}
}

// unwanted reports whether err is one the batch job's requests cannot
// cause: a key mismatch or conflict (every call of an operation sends the
// same request), an invalid request, a key the server says is missing.
func unwanted(err error) bool {
	for _, e := range []error{idemhttp.ErrKeyMismatch, idemhttp.ErrKeyConflict, idemhttp.ErrInvalidRequest, idemhttp.ErrInvalidKey, idemhttp.ErrKeyRequired, idemhttp.ErrBodyChanged} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func sortStrings(s []string) { slices.Sort(s) }

// heldByServer reports whether the server holds op's key in progress
// for the TTL, as it must, so that no answer can settle it: op's one
// effect committed, and its key is held by a claim with no record: in the
// transactional world, the claim row its handler's own COMMIT committed,
// its process dead before the marker (docs/server.md, "The claim row of
// the transactional mode"); in the streamed world, a claim pinned for
// the TTL when no Complete got through. A retry gets 409 until the TTL,
// never a second run. (A key held so whose handler did not commit itself
// is a record the core failed to keep with its effect: the planted
// after-commit bug.)
func (w *world) heldByServer(op int) bool {
	es := w.ledger.of(op)
	if len(es) != 1 {
		return false
	}
	k := es[0].storeKey
	if w.cfg.Shell == shellStreamed {
		record, ok := w.kv.Record(k)
		return ok && record == nil
	}
	w.mu.Lock()
	self := w.selfCommitted[k]
	w.mu.Unlock()
	record, ok := w.ledger.database().Row(k)
	return self && ok && record == nil
}
