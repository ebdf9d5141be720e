//go:build go1.26

package sim

import (
	"fmt"
	"net/http"
)

// Handlers that take the connection (issue 32 §1.3): in the seeds that
// draw it (Config.Hijack), a share of the handler's runs, once they have
// charged, answer outside the shell:
//
//   - streamed (idemserver.Middleware): the handler hijacks the
//     connection (net/http's Hijacker works on the simulated one) and
//     writes its own HTTP/1.1 response, the charge's 200, then closes it.
//     What it sent bypassed the shell, which cannot replay it: the core
//     keeps the key completed, not replayable, and a retry gets 410,
//     never a second run (idemserver's hijack tests, servercore's
//     TestReturnedRules).
//   - transactional (servermodel.TxServer, TxMiddleware's steps): the
//     response waits for the commit, so the shell offers no Hijacker:
//     the handler's Hijack fails and it answers as usual; or the handler
//     answers 101 Switching Protocols, which cannot wait for the commit
//     either, and the request is rolled back, its charge with it (500),
//     and its key released (contrib/postgres's TestTxSwitchingProtocols).
//
// 101 is not drawn in the streamed world: the client would read it as
// the request's final answer, a status the batch job cannot take for
// success or failure (docs/simulation.md, what is not in the world).

// hijacks reports whether the run named name takes the connection.
func (w *world) hijacks(name string) bool {
	return w.faulty.Load() && w.cfg.Hijack > 0 && w.draw(100, "hijack", name) < w.cfg.Hijack
}

// hijackRespond answers e's charge on the connection itself, outside the
// shell; it reports false when the connection cannot be taken (then the
// caller answers as usual).
func (p *serverProc) hijackRespond(rw http.ResponseWriter, e *effect) bool {
	conn, bw, err := http.NewResponseController(rw).Hijack()
	if err != nil {
		p.w.count("handler's hijack refused")
		return false
	}
	defer conn.Close()
	p.w.count("handler hijacks")
	p.w.tracef("server %d: the handler of op %d key %s hijacks its connection", p.n, e.op, e.key)
	_, _ = fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(e.body))
	_, _ = bw.Write(e.body)
	_ = bw.Flush()
	return true
}

// switchProtocols answers 101 Switching Protocols (the transactional
// world's): the shell rolls the request back.
func (p *serverProc) switchProtocols(rw http.ResponseWriter, e *effect) {
	p.w.count("handler switches protocols")
	p.w.tracef("server %d: the handler of op %d key %s answers 101", p.n, e.op, e.key)
	rw.Header().Set("Upgrade", "sim/1")
	rw.WriteHeader(http.StatusSwitchingProtocols)
}
