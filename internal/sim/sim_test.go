//go:build go1.26

package sim

import (
	"crypto/subtle"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The seeds allocate a world each and keep little: collecting less
	// often costs memory the machine has, and saves a tenth of the time.
	debug.SetGCPercent(400)
	if len(planted) > 0 {
		// A planted bug may leave a failing seed's goroutines blocked in
		// its bubble for good (idemhttp_bug_clockback: a Complete's
		// retries held for the jump); TestSim reports that seed's leak
		// as the bug found, and the process ends with them.
		os.Exit(m.Run())
	}
	goleak.VerifyTestMain(m)
}

var (
	flagSeeds   = flag.Int("sim.seeds", 10000, "how many seeds TestSim runs (under the race detector, unless set, raceSeeds)")
	flagFirst   = flag.Uint64("sim.first", 1, "the first seed TestSim runs")
	flagSeed    = flag.Uint64("sim.seed", 0, "run only this seed (with -sim.config, as a failure printed it), and print its trace")
	flagConfig  = flag.String("sim.config", "", "the world of -sim.seed (name=value,...), as a failure printed it; without -sim.seed, what every seed's world is changed by")
	flagWorkers = flag.Int("sim.workers", 0, "seeds run at once; 0 means GOMAXPROCS")
	flagShrink  = flag.Int("sim.shrink", 300, "runs a failure's shrinking may take")
	flagTwice   = flag.Int("sim.twice", 97, "every nth seed runs twice, and the two traces must agree")
	flagLive    = flag.Bool("sim.live", false, "print each line of a trace as it is made (for a run that does not end)")
	flagKnown   = flag.String("sim.known", "", "find, shrink and print the first seed a known bug whose name holds this explains")
	flagPlanted = flag.Bool("sim.planted", false, "TestPlantedBugs: build the package with each planted bug's tag in turn, and show that TestSim finds it")
	flagMaxFail = flag.Int("sim.maxfail", 3, "TestSim stops after this many failing seeds")
	flagHashes  = flag.String("sim.hashes", "", "TestSim writes each seed's trace hash to this file, a line \"seed hash\" each (for TestSimDeterminism)")
	flagDeterm  = flag.Int("sim.determinism", 0, "TestSimDeterminism: run this many seeds in two processes at once, and compare every seed's trace hash")
)

// PlantedTags are the build tags of the planted bugs, one bug each: in
// the client and the journal (internal/plant's *_off.go, the log's
// sync_off.go), in the server core and the modelled database (the
// server's, internal/plant's too), in the simulator's handler
// (bug_splitcommit_off.go).
var PlantedTags = []string{
	"idemhttp_nosync",           // the journal's syncs off: an acknowledged Begin is lost in a power cut
	"idemhttp_bug_newkey",       // a retry mints a new key
	"idemhttp_bug_resetnotsent", // a reset after the request was written is taken for "not sent"
	"idemhttp_bug_noslots",      // no sender's slot: an entry withdrawn while another call sends under it
	"idemhttp_bug_splitcommit",  // the server stores its record outside the effect's commit
	// Issue 32's, one per dimension it added:
	"idemhttp_bug_redirectdone", // the caller's options: a 3xx the client's rules left unfollowed recorded done
	"idemhttp_bug_panicslot",    // the caller's callbacks: a call a panic ended keeps its slots and its entry
	"idemhttp_bug_nolease",      // the fleet: a Begin that finds an entry leaves its lease with the old holder
	"idemhttp_bug_giveupdone",   // what users see: an exhausted give-up recorded done
	"idemhttp_bug_unfinal",      // what users see: a done entry revived by a stale worker
	"idemhttp_bug_randkey",      // same seed, same trace: keys from a source no seed reaches
	// Issue 32's server (§1.3):
	"idemhttp_bug_aftercommit",  // the record stored in a transaction of its own, after the effect's commit
	"idemhttp_bug_completeonce", // a Streamed Complete tried once: no retry while the claim's lock is live
	"idemhttp_bug_giveupstored", // a Transactional handler that gave up kept as an empty 200, its transaction committed
	// Issue 32's server process (§1.3): its clock, hijacked connections.
	"idemhttp_bug_procdeadline", // a store call's deadline a reading of the process's clock, measured on the runtime's
	"idemhttp_bug_clockback",    // the process's clock followed back: renewals and a Complete's retries held for the jump
	"idemhttp_bug_hijackstored", // a hijacked response kept as an empty 200 for replay
	// Issue 32's client items the first phase left out:
	"idemhttp_bug_opensettle",        // the journal's open goes on after its settling of the last batch failed
	"idemhttp_bug_classifiednotsent", // a failed attempt Policy.Classify asked to retry counts as not sent
	"idemhttp_bug_getbodyrewind",     // a retry's body taken from the caller's GetBody again, unchecked
	"idemhttp_bug_resultencoding",    // a kept result loses its Content-Encoding
	"idemhttp_bug_resulturl",         // a kept result's URL-valued headers kept as the server wrote them
	"idemhttp_bug_resumeprunes",      // Resume without Entries prunes a journal that prunes itself, by the caller's clock
}

// raceSeeds is how many seeds TestSim runs under the race detector
// unless -sim.seeds says: the test command CI runs (go test -race) stays
// within its minute, and CI's second run, without the race detector,
// runs the 10,000 (docs/simulation.md).
const raceSeeds = 1000

// flagSet reports whether the flag name was given.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestPlantedBugs runs, with -sim.planted, "go test -tags <tag> -run
// 'TestSim$'" for each planted bug, and checks that each finds its bug
// within the seeds TestSim runs (10,000 by default): a planted bug the
// simulator does not find is a hole in the simulator.
func TestPlantedBugs(t *testing.T) {
	if !*flagPlanted {
		t.Skip("with -sim.planted: builds the package once per planted bug")
	}
	for _, tag := range PlantedTags {
		t.Run(tag, func(t *testing.T) {
			cmd := exec.Command("go", "test", "-tags", tag, "-count=1", "-run", "TestSim$", "-v", ".", "-args", fmt.Sprintf("-sim.seeds=%d", *flagSeeds))
			out, err := cmd.CombinedOutput()
			found := ""
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "planted bug") && strings.Contains(l, "found at seed") {
					found = strings.TrimSpace(l)
				}
			}
			if err != nil || found == "" {
				t.Fatalf("%s not found (%v):\n%s", tag, err, out)
			}
			t.Log(found)
		})
	}
}

// TestSim runs -sim.seeds seeds (10,000 by default) and checks every
// invariant of each (see the package doc and docs/simulation.md). A
// failing seed is shrunk and printed with the command that replays it.
// Built with one of the planted bugs' tags, it must find the bug instead.
func TestSim(t *testing.T) {
	Live = *flagLive
	if *flagSeed != 0 {
		replay(t, *flagSeed, *flagConfig)
		return
	}
	n := *flagSeeds
	if raceEnabled && !flagSet("sim.seeds") {
		n = raceSeeds
	}
	workers := *flagWorkers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var (
		next     atomic.Uint64
		ran      atomic.Int64
		stop     atomic.Bool
		mu       sync.Mutex
		failed   []*Result
		known    = map[string]int{}
		limits   = map[string]int{}
		faults   = map[string]int{}
		outcomes = map[string]int{}
		mismatch []string
		sizes    [3]int  // steps, requests, client processes
		all      [8]byte // every seed's trace hash, XORed: the run's, whatever the order seeds ended in
		hashes   *os.File
	)
	if *flagHashes != "" {
		f, err := os.Create(*flagHashes)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		hashes = f
	}
	next.Store(*flagFirst)
	last := *flagFirst + uint64(n)
	start := time.Now()
	t.Run("seeds", func(t *testing.T) {
		for i := range workers {
			t.Run(fmt.Sprint("worker", i), func(t *testing.T) {
				t.Parallel()
				for !stop.Load() {
					seed := next.Add(1) - 1
					if seed >= last {
						return
					}
					cfg, err := ParseConfig(ConfigFor(seed), *flagConfig)
					if err != nil {
						t.Error(err)
						return
					}
					res := RunSeed(t, seed, cfg)
					ran.Add(1)
					if *flagTwice > 0 && seed%uint64(*flagTwice) == 0 {
						if again := RunSeed(t, seed, cfg); again.Hash != res.Hash {
							mu.Lock()
							mismatch = append(mismatch, fmt.Sprintf("seed %d: trace %s, then %s (first difference: %s)", seed, res.Hash, again.Hash, firstDiff(res.Trace, again.Trace)))
							if len(planted) > 0 {
								// A planted race: found.
								res.Failures = append(res.Failures, Failure{Inv: invSameTrace, Op: -1, Msg: mismatch[len(mismatch)-1]})
							}
							mu.Unlock()
						}
					}
					mu.Lock()
					if hashes != nil {
						fmt.Fprintf(hashes, "%d %s\n", seed, res.Hash)
					}
					if h, err := hex.DecodeString(res.Hash); err == nil {
						subtle.XORBytes(all[:], all[:], h)
					}
					for k, v := range res.Faults {
						faults[k] += v
					}
					for k, v := range res.Outcomes {
						outcomes[k] += v
					}
					sizes[0] += res.Steps
					sizes[1] += res.Requests
					sizes[2] += res.Procs
					for _, f := range res.Failures {
						if f.Known != "" {
							known[f.Known]++
						}
						if f.Limit != "" {
							limits[f.Limit]++
						}
					}
					if *flagKnown != "" {
						for _, f := range res.Failures {
							if strings.Contains(f.Known, *flagKnown) && !stop.Swap(true) {
								failed = append(failed, res)
							}
						}
						mu.Unlock()
						continue
					}
					if len(Unknown(res)) > 0 {
						failed = append(failed, res)
						if len(planted) > 0 || len(failed) >= *flagMaxFail {
							stop.Store(true) // enough to report; the rest would only repeat it
						}
					}
					mu.Unlock()
				}
			})
		}
	})
	elapsed := time.Since(start)
	t.Logf("%d seeds in %v (%.0f seeds/s, %d at once)", ran.Load(), elapsed.Round(time.Millisecond), float64(ran.Load())/elapsed.Seconds(), workers)
	if r := ran.Load(); r > 0 {
		t.Logf("per seed: %.0f steps, %.1f requests delivered, %.1f client processes", float64(sizes[0])/float64(r), float64(sizes[1])/float64(r), float64(sizes[2])/float64(r))
	}
	t.Logf("trace hash of the %d seeds (each seed's, XORed): %x", ran.Load(), all)
	t.Logf("faults injected: %s", summary(faults))
	t.Logf("calls' outcomes, as the job read them: %s", summary(outcomes))
	t.Logf("invariants checked: %s", strings.Join(Invariants, "; "))
	if len(known) > 0 {
		t.Logf("known bugs of the client met (failures they explain; see known.go): %s", summary(known))
	}
	if len(limits) > 0 {
		t.Logf("documented limits met (failures no code can prevent, not bugs; see docs/simulation.md): %s", summary(limits))
	}
	for _, m := range mismatch {
		if len(planted) == 0 {
			t.Errorf("not deterministic: %s", m)
		}
	}
	slices.SortFunc(failed, func(a, b *Result) int { return int(a.Seed) - int(b.Seed) })
	if *flagKnown != "" {
		for _, r := range failed {
			isIt := func(r *Result) bool {
				for _, f := range r.Failures {
					if strings.Contains(f.Known, *flagKnown) {
						return true
					}
				}
				return false
			}
			small, sr := ShrinkBy(t, r.Seed, r.Config, isIt, *flagShrink)
			t.Logf("seed %d, shrunk world: %s\n%s", r.Seed, small, strings.Join(Shorten(sr), "\n"))
		}
		return
	}
	if len(planted) > 0 {
		if len(failed) == 0 {
			t.Fatalf("planted bug %s NOT found in %d seeds", strings.Join(planted, "+"), ran.Load())
		}
		r := failed[0]
		t.Logf("planted bug %s found at seed %d, after %d seeds: %s", strings.Join(planted, "+"), r.Seed, ran.Load(), Unknown(r)[0])
		report(t, r, t.Logf)
		return
	}
	for _, r := range failed {
		report(t, r, t.Errorf)
	}
}

// report shrinks a failure and prints it: the replay command, the
// shrunk world and its trace.
func report(t *testing.T, r *Result, logf func(string, ...any)) {
	t.Helper()
	if f := Unknown(r)[0]; f.Inv == invSameTrace {
		logf("seed %d: %s\nreplay twice and compare: go test ./internal/sim -run 'TestSim$' -sim.seed=%d -v%s", r.Seed, f, r.Seed, tagsFlag())
		return
	}
	small, sr := Shrink(t, r.Seed, r.Config, Unknown(r)[0].Inv, *flagShrink)
	what := Unknown(r)[0]
	if fs := Unknown(sr); len(fs) > 0 {
		what = fs[0]
	} else {
		// The seed's replay did not fail as it did: a race the world does
		// not order (the planted noslots bug's two calls of one operation
		// really do race), reported as found all the same, with the
		// replay's trace.
		logf("seed %d: its replay did not break %q again (a race outside the driver's turns)", r.Seed, what.Inv)
	}
	logf("seed %d: %s\nreplay: go test ./internal/sim -run 'TestSim$' -sim.seed=%d -sim.config='%s' -v%s\nshrunk from %s\nshrunk trace:\n%s",
		r.Seed, what, r.Seed, small, tagsFlag(), r.Config, strings.Join(Shorten(sr), "\n"))
}

func tagsFlag() string {
	if len(planted) == 0 {
		return ""
	}
	var tags []string
	for _, p := range planted {
		tags = append(tags, "idemhttp_"+p)
	}
	return " -tags " + strings.Join(tags, ",")
}

// replay runs one seed and prints its whole trace.
func replay(t *testing.T, seed uint64, config string) {
	cfg, err := ParseConfig(ConfigFor(seed), config)
	if err != nil {
		t.Fatal(err)
	}
	res := RunSeed(t, seed, cfg)
	t.Logf("seed %d, world %s", seed, cfg)
	for _, l := range res.Trace {
		t.Log(l)
	}
	t.Logf("trace hash %s; faults: %s", res.Hash, summary(res.Faults))
	for _, f := range res.Failures {
		switch {
		case f.Known != "":
			t.Logf("known bug: %s", f)
		case f.Limit != "":
			t.Logf("documented limit: %s", f)
		case len(planted) > 0:
			t.Logf("planted bug %s: %s", strings.Join(planted, "+"), f)
		default:
			t.Error(f)
		}
	}
}

func summary(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", k, m[k])
	}
	return b.String()
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("line %d: %q / %q", i, a[i], b[i])
		}
	}
	return fmt.Sprintf("lengths %d / %d", len(a), len(b))
}

// TestSimDeterminism runs, with -sim.determinism=N, seeds -sim.first to
// -sim.first+N-1 in two processes of this test binary at once, each
// writing every seed's trace hash (the trace and what the disk holds at
// the end: see world.diskDigest), and checks that the two agree on every
// seed: same seed, same run, also across processes, whose goroutines are
// scheduled their own way. (TestSim's -sim.twice runs a sample twice in
// one process.) 100,000 seeds take about ten minutes on two cores.
func TestSimDeterminism(t *testing.T) {
	if *flagDeterm <= 0 {
		t.Skip("with -sim.determinism=N: runs N seeds in two processes and compares their traces")
	}
	dir := t.TempDir()
	files := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b")}
	var wg sync.WaitGroup
	errs := make([]error, len(files))
	outs := make([][]byte, len(files))
	start := time.Now()
	for i, f := range files {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestSim$", "-test.timeout", "0",
				fmt.Sprintf("-sim.seeds=%d", *flagDeterm), fmt.Sprintf("-sim.first=%d", *flagFirst),
				"-sim.twice=0", "-sim.hashes="+f, "-sim.config="+*flagConfig, "-sim.maxfail=1000000000", "-sim.shrink=0")
			outs[i], errs[i] = cmd.CombinedOutput()
		})
	}
	wg.Wait()
	for i := range files {
		if errs[i] != nil {
			// TestSim failed (a seed broke an invariant): its hashes are
			// still every seed's; the failures are TestSim's to report.
			t.Logf("process %d: %v (TestSim's failures follow; each seed's hash was written all the same)", i, errs[i])
			for _, l := range strings.Split(string(outs[i]), "\n") {
				if strings.Contains(l, "sim_test.go") && strings.Contains(l, ": seed ") {
					t.Log(strings.TrimSpace(l))
				}
			}
		}
	}
	read := func(name string) map[string]string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if seed, h, ok := strings.Cut(l, " "); ok {
				m[seed] = h
			}
		}
		return m
	}
	a, b := read(files[0]), read(files[1])
	if len(a) != *flagDeterm || len(b) != *flagDeterm {
		t.Fatalf("the processes ran %d and %d seeds of %d", len(a), len(b), *flagDeterm)
	}
	var differ []string
	for seed, h := range a {
		if b[seed] != h {
			differ = append(differ, seed)
		}
	}
	slices.Sort(differ)
	t.Logf("%d seeds from %d, twice, in two processes at once: %v", len(a), *flagFirst, time.Since(start).Round(time.Second))
	if len(differ) > 0 {
		t.Errorf("%d seeds gave two traces: %s (replay one with -sim.seed=N -v, twice, and compare)", len(differ), strings.Join(differ[:min(len(differ), 20)], " "))
	}
}
