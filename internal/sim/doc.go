//go:build go1.26

// Package sim is a deterministic simulator of the whole system: the
// project's own client, journal and server, run together in one process
// through faults that compose, over many seeded worlds, with the
// invariants of effectively-once checked at the end of each (issue 25;
// docs/simulation.md at the repository's root says how to run it, what it
// models and what it does not).
//
// What runs is the real code: an idemhttp.Client (Do, StandardClient,
// Resume, reruns of a batch named with WithOperation, and calls the client
// keys itself) whose Journal is a filejournal.Journal on the simulated disk
// of internal/wal/simdisk (or, for a fleet of client machines,
// journaltest.FleetModel, the fleet contract that contrib/postgres's
// Journal is held to), and whose http.Transport dials in-memory
// connections to one or two http.Servers serving a router and the server
// core (internal/servercore) in one of its shells around a business
// handler: idemserver.Middleware over a Store, or the transactional shell
// of internal/servermodel (TxMiddleware's steps). Each seed also draws the
// caller's configuration (issue 32): two Clients on one journal, servers
// that redirect and the caller's CheckRedirect, transports that hide
// their httptrace events, callbacks that panic or block; and the server's:
// its shell, its instances and tenants, handlers that commit early, fail,
// give up or leave their transaction aborted. What is
// modelled is what those run on: the network (a dial refused, a request
// or a response lost, delayed, reordered, a reset before or after the
// server saw the request, a pooled connection the server closed, which
// net/http resends on by itself), the disk (a power cut keeps what was
// synced and perhaps a torn prefix of the rest, a killed process keeps
// the cache, ENOSPC and EIO on writes, syncs and the rest), the machines
// (the client's process killed or its power cut at any step or at a
// chosen disk call; the server's process crashed at any point of a
// request), the clocks (each client machine's and the fleet database's,
// set forward and back), the fleet database's connection, and the
// server's database (internal/servermodel): a transactional database
// whose records and effects commit together or not at all, or a Store
// beside the business's database, either refusing a call, out of memory,
// losing an answer, hanging, cut off for a while, or with its clock
// jumping. The invariants read the effects it committed.
//
// A world is one seed: Config draws its size and faults, and one driver
// goroutine takes one step at a time (delivers a message, answers a dial,
// starts a call, lets one call into the journal or a held handler go on,
// crashes something, jumps a clock, lets time pass), waiting between
// two steps until every other goroutine is blocked (testing/synctest, in
// virtual time). Same seed, same run: the trace of one run of a seed is
// the trace of any other; TestSim checks that on a sample, and
// TestSimDeterminism across processes.
//
// Run it with go test: TestSim runs 10,000 seeds (1,000 under the race
// detector; -sim.seeds for more),
// shrinks a failure and prints the command that replays it. Built with a
// planted bug's tag (see PlantedTags in the tests), TestSim must find
// that bug instead. Bugs it found that are not fixed yet are in known.go:
// their failures are counted, not failed, and each has a skipped test
// that replays it.
package sim
