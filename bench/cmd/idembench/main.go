// Command idembench runs the same workloads through raw net/http,
// go-retryablehttp, stripe-go and idemhttp against loopback idemtest
// servers and prints one Markdown table: per-request overhead, a chaos run,
// a full outage, a crash and restart of a batch, and the journal's cost.
//
// From the repository root:
//
//	go run ./bench/cmd/idembench
//
// Progress goes to stderr, the table to stdout. Flags set the seed and the
// sizes; -only picks scenarios (overhead, chaos, outage, crash, journal).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/bench/internal/suite"
)

func main() {
	suite.MaybeRunChild()
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	var (
		seed        = fs.Uint64("seed", 1, "seeds fault decisions and the crash's kill point")
		only        = fs.String("only", "overhead,chaos,outage,crash,journal", "comma-separated scenarios to run")
		peers       = fs.String("peers", strings.Join(suite.Peers(), ","), "comma-separated peers")
		dialect     = fs.String("dialect", string(suite.DialectStripe), "server error dialect for chaos and outage: stripe or ietf")
		timeout     = fs.Duration("timeout", time.Second, "http.Client.Timeout of every peer: bounds one attempt")
		ovTimeout   = fs.Duration("overhead-timeout", time.Second, "overhead: http.Client.Timeout of every peer (negative: none)")
		rounds      = fs.Int("runs", 60, "overhead: interleaved benchmark runs per peer")
		benchtime   = fs.String("benchtime", "100x", "overhead: length of one benchmark run, as go test's -benchtime (a duration or Nx)")
		chaosOps    = fs.Int("chaos-ops", 1000, "chaos: operations per peer")
		concurrency = fs.Int("concurrency", 16, "chaos and crash: concurrent workers")
		outageOps   = fs.Int("outage-ops", 1000, "outage: operations per peer")
		outageLen   = fs.Duration("outage", 3*time.Second, "outage: length of the outage")
		outageSpan  = fs.Duration("outage-span", 4*time.Second, "outage: operations arrive evenly over this span")
		retryAfter  = fs.Duration("outage-retry-after", time.Second, "outage: Retry-After sent with its 503s (negative: \"0\")")
		crashOps    = fs.Int("crash-ops", 400, "crash: operations in the batch")
		latency     = fs.Duration("crash-latency", 50*time.Millisecond, "crash: reply delay after the side effect")
		journalOps  = fs.Int("journal-ops", 500, "journal: operations per concurrency")
		dir         = fs.String("dir", "", "directory for journals and done-files (default: a temporary directory)")
		control     = fs.Bool("overhead-control", true, "overhead: also measure raw net/http sending a fresh Idempotency-Key (raw+key), whose server does the keyed peers' work")
		otherDial   = fs.Bool("stripe-other-dialect", true, "chaos and outage: also run stripe-go against the other error dialect, whose error bodies decide whether it retries")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// testing.Benchmark reads its run time from the testing flags.
	testing.Init()
	if err := flag.Set("test.benchtime", *benchtime); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	peerList := strings.Split(*peers, ",")
	scenarios := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains([]string{"overhead", "chaos", "outage", "crash", "journal"}, s) {
			return fmt.Errorf("-only: unknown scenario %q", s)
		}
		scenarios[s] = true
	}
	progress := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	progress("idembench: GOMAXPROCS=%d %s/%s %s, seed %d", runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(), *seed)

	var rep suite.Report
	start := time.Now()
	if scenarios["overhead"] {
		peers := slices.Clone(peerList)
		if *control {
			peers = append(peers, suite.PeerRawKey)
		}
		rep.OverheadConfig = suite.OverheadConfig{Peers: peers, Runs: *rounds, Timeout: *ovTimeout, Progress: func(peer string, run int, r testing.BenchmarkResult) {
			progress("overhead run %d %-13s %s %s", run+1, peer, r.String(), r.MemString())
		}}
		res, err := suite.Overhead(ctx, rep.OverheadConfig)
		if err != nil {
			return err
		}
		rep.Overhead = res
	}
	// runs lists the peers to run with the server's dialect, then, with
	// -stripe-other-dialect, stripe-go again with the other one.
	type peerRun struct {
		peer, label string
		dialect     suite.Dialect
	}
	var runs []peerRun
	for _, p := range peerList {
		runs = append(runs, peerRun{p, p, suite.Dialect(*dialect)})
	}
	if *otherDial && slices.Contains(peerList, suite.PeerStripe) {
		other := suite.DialectIETF
		if suite.Dialect(*dialect) == suite.DialectIETF {
			other = suite.DialectStripe
		}
		runs = append(runs, peerRun{suite.PeerStripe, fmt.Sprintf("%s (%s errors)", suite.PeerStripe, other), other})
	}
	if scenarios["chaos"] {
		rep.ChaosConfig = suite.ChaosConfig{Ops: *chaosOps, Concurrency: *concurrency, Seed: *seed, Timeout: *timeout, Dialect: suite.Dialect(*dialect), Dir: *dir}
		for _, pr := range runs {
			cfg := rep.ChaosConfig
			cfg.Peers, cfg.Dialect = []string{pr.peer}, pr.dialect
			res, err := suite.Chaos(ctx, cfg)
			if err != nil {
				return err
			}
			res[0].Peer = pr.label
			progress("chaos %-26s done in %s: %s", pr.label, res[0].Wall.Round(time.Millisecond), res[0].Server)
			rep.Chaos = append(rep.Chaos, res...)
		}
	}
	if scenarios["outage"] {
		rep.OutageConfig = suite.OutageConfig{Ops: *outageOps, Span: *outageSpan, Length: *outageLen, RetryAfter: *retryAfter, Timeout: *timeout, Dialect: suite.Dialect(*dialect)}
		for _, pr := range runs {
			cfg := rep.OutageConfig
			cfg.Peers, cfg.Dialect = []string{pr.peer}, pr.dialect
			res, err := suite.Outage(ctx, cfg)
			if err != nil {
				return err
			}
			res[0].Peer = pr.label
			progress("outage %-26s done in %s: %d attempts for %d ops", pr.label, res[0].Wall.Round(time.Millisecond), res[0].Attempts, res[0].Ops)
			rep.Outage = append(rep.Outage, res...)
		}
	}
	if scenarios["crash"] {
		rep.CrashConfig = suite.CrashConfig{Peers: peerList, Ops: *crashOps, Concurrency: *concurrency, Seed: *seed, Latency: *latency, Timeout: *timeout, Dir: *dir}
		for _, p := range peerList {
			cfg := rep.CrashConfig
			cfg.Peers = []string{p}
			res, err := suite.Crash(ctx, cfg)
			if err != nil {
				return err
			}
			progress("crash %-13s done in %s: %d in flight at the kill, %d duplicates after rerun", p, res[0].Wall.Round(time.Millisecond), res[0].InFlight, res[0].Duplicates)
			rep.Crash = append(rep.Crash, res...)
		}
	}
	if scenarios["journal"] {
		rep.JournalConfig = suite.JournalConfig{Ops: *journalOps, Dir: *dir}
		res, err := suite.JournalCost(ctx, rep.JournalConfig)
		if err != nil {
			return err
		}
		progress("journal done")
		rep.Journal = res
	}
	progress("all done in %s", time.Since(start).Round(time.Second))
	fmt.Print(rep.Table())
	return nil
}
