//go:build go1.26

package msgsim

import (
	"crypto/subtle"
	"encoding/hex"
	"flag"
	"fmt"
	"os/exec"
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
	debug.SetGCPercent(400)
	goleak.VerifyTestMain(m)
}

var (
	flagSeeds   = flag.Int("msgsim.seeds", 2000, "how many seeds TestMsgSim runs (under the race detector, unless set, raceSeeds)")
	flagFirst   = flag.Uint64("msgsim.first", 1, "the first seed TestMsgSim runs")
	flagSeed    = flag.Uint64("msgsim.seed", 0, "run only this seed (with -msgsim.config, as a failure printed it), and print its trace")
	flagConfig  = flag.String("msgsim.config", "", "the world of -msgsim.seed (name=value,...); without -msgsim.seed, what every seed's world is changed by")
	flagWorkers = flag.Int("msgsim.workers", 0, "seeds run at once; 0 means GOMAXPROCS")
	flagShrink  = flag.Int("msgsim.shrink", 200, "runs a failure's shrinking may take")
	flagTwice   = flag.Int("msgsim.twice", 50, "every nth seed runs twice, and the two traces must agree")
	flagLive    = flag.Bool("msgsim.live", false, "print each line of a trace as it is made")
	flagPlanted = flag.Bool("msgsim.planted", false, "TestPlantedBugs: build the package with each planted bug's tag in turn, and show that TestMsgSim finds it")
	flagMaxFail = flag.Int("msgsim.maxfail", 3, "TestMsgSim stops after this many failing seeds")
)

// PlantedTags are the build tags of the planted bugs of the consumer
// side (internal/plant), one bug each.
var PlantedTags = []string{
	"idemhttp_bug_countshutdowns",        // the message core counts a shutdown's requeue as the handler's failure
	"idemhttp_bug_splitdedup",            // the inbox records the id in a transaction of its own, outside the effect's
	"idemhttp_bug_ackfirst",              // the inbox reports success before the effect's commit: an ack before it
	"idemhttp_bug_heldreject",            // the RabbitMQ model nacks a delivery held for its delay without requeue: a dead letter
	"idemhttp_bug_forgetdeadletter",      // the message core forgets a message's record after a dead letter that failed
	"idemhttp_bug_batchnotombstone",      // the inbox's batch of several ids reads no tombstone: a dead-lettered id acked as a duplicate
	"idemhttp_bug_dropspace",             // the inbox's Handle drops the id space from the stored key: two queues' colliding ids taken for one
	"idemhttp_bug_redrivekeepstombstone", // the ledger's Redrive forgets the record but keeps the tombstone: the redriven message dead-lettered again
	"idemhttp_bug_prunemillis",           // the inbox's Prune passes its age in milliseconds: ids a thousand times younger pruned
	"idemhttp_bug_nobeat",                // the Runner never beats: a slow handler's delivery goes to another consumer at its ack wait
}

// raceSeeds is how many seeds TestMsgSim runs under the race detector
// unless -msgsim.seeds says.
const raceSeeds = 300

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// TestMsgSim runs -msgsim.seeds seeds and checks every invariant of each
// (docs/simulation.md, the consumers' section). A failing seed is shrunk
// and printed with the command that replays it. Built with a planted
// bug's tag, it must find the bug instead.
//
// Checked to fail, within 3 seeds each, with: the modelled inbox insert
// always reporting a new row (invariant 1); a requeue dropping the
// message (2); every dead-lettered message's effect counted as committed
// (3); the Runner's MaxDeliveries one below the oracle's (5); a message
// without an id delivered with Arrival.HasID true (8); the operator's
// redrive not publishing the dead letter again (9); the pruner's age not
// counting the broker's redelivery horizon (10); the beat hook's renewal
// a no-op (11); a requeue due in a thousand hours (liveness). The planted bugs break 4, 5, 6 and 7.
func TestMsgSim(t *testing.T) {
	Live = *flagLive
	if *flagSeed != 0 {
		replay(t, *flagSeed, *flagConfig)
		return
	}
	n := *flagSeeds
	if raceEnabled && !flagSet("msgsim.seeds") {
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
		stats    = map[string]int{}
		known    = map[string]int{}
		mismatch []string
		steps    int
		all      [8]byte
	)
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
							mu.Unlock()
						}
					}
					mu.Lock()
					if h, err := hex.DecodeString(res.Hash); err == nil {
						subtle.XORBytes(all[:], all[:], h)
					}
					for k, v := range res.Stats {
						stats[k] += v
					}
					steps += res.Steps
					for _, f := range res.Failures {
						if f.Known != "" {
							known[f.Known]++
						}
					}
					if len(Unknown(res)) > 0 {
						failed = append(failed, res)
						if len(planted) > 0 || len(failed) >= *flagMaxFail {
							stop.Store(true)
						}
					}
					mu.Unlock()
				}
			})
		}
	})
	elapsed := time.Since(start)
	t.Logf("%d seeds in %v (%.0f seeds/s, %d at once), %.0f steps per seed", ran.Load(), elapsed.Round(time.Millisecond),
		float64(ran.Load())/elapsed.Seconds(), workers, float64(steps)/float64(max(ran.Load(), 1)))
	t.Logf("trace hash of the %d seeds (each seed's, XORed): %x", ran.Load(), all)
	t.Logf("faults and events: %s", summary(stats))
	t.Logf("invariants checked: %s", strings.Join(Invariants, "; "))
	if len(known) > 0 {
		t.Logf("known limits met (failures they explain; see Known): %s", summary(known))
	}
	for _, m := range mismatch {
		t.Errorf("not deterministic: %s", m)
	}
	slices.SortFunc(failed, func(a, b *Result) int { return int(a.Seed) - int(b.Seed) })
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
	small, sr := Shrink(t, r.Seed, r.Config, Unknown(r)[0].Inv, *flagShrink)
	f := Unknown(r)[0]
	if u := Unknown(sr); len(u) > 0 {
		f = u[0]
	}
	logf("seed %d: %s\nreplay: go test ./internal/msgsim -run 'TestMsgSim$' -msgsim.seed=%d -msgsim.config='%s' -v%s\nshrunk from %s\nshrunk trace:\n%s",
		r.Seed, f, r.Seed, small, tagsFlag(), r.Config, strings.Join(Shorten(sr), "\n"))
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
	t.Logf("trace hash %s; %s", res.Hash, summary(res.Stats))
	for _, f := range res.Failures {
		if f.Known != "" || len(planted) > 0 {
			t.Logf("planted bug %s: %s", strings.Join(planted, "+"), f)
		} else {
			t.Error(f)
		}
	}
}

// TestMsgSimSameSeedSameTrace runs seeds twice each and compares their
// traces' hashes (the trace and the database's and broker's end state):
// same seed, same run. Checked to fail with the driver granting turns in
// the order they were asked for instead of by their sorted names.
func TestMsgSimSameSeedSameTrace(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		cfg := ConfigFor(seed)
		a, b := RunSeed(t, seed, cfg), RunSeed(t, seed, cfg)
		if a.Hash != b.Hash {
			t.Errorf("seed %d: trace %s, then %s (first difference: %s)", seed, a.Hash, b.Hash, firstDiff(a.Trace, b.Trace))
		}
	}
}

// TestPlantedBugs runs, with -msgsim.planted, "go test -tags <tag> -run
// 'TestMsgSim$'" for each planted bug, and checks that each finds its bug
// within the seeds TestMsgSim runs: a planted bug the simulator does not
// find is a hole in it.
func TestPlantedBugs(t *testing.T) {
	if !*flagPlanted {
		t.Skip("with -msgsim.planted: builds the package once per planted bug")
	}
	for _, tag := range PlantedTags {
		t.Run(tag, func(t *testing.T) {
			cmd := exec.Command("go", "test", "-tags", tag, "-count=1", "-run", "TestMsgSim$", "-v", ".", "-args", fmt.Sprintf("-msgsim.seeds=%d", *flagSeeds))
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
