package suite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
)

// CrashConfig configures [Crash]. A zero field means the default in its
// comment.
type CrashConfig struct {
	Peers       []string // nil means [Peers]
	Ops         int      // operations in the batch; 0 means 400
	Concurrency int      // workers; 0 means 16
	Seed        uint64   // picks the kill point

	// Latency delays every reply after its side effect has run (a server
	// that commits, then takes a while to answer), so the operations in
	// flight when the batch dies have run; 0 means 50 ms.
	Latency time.Duration

	Timeout time.Duration // http.Client.Timeout, per attempt; 0 means 1 s

	// Dir holds the done-files and idemhttp's journal; "" means a new
	// temporary directory, removed afterwards.
	Dir string
}

func (c CrashConfig) withDefaults() CrashConfig {
	if c.Peers == nil {
		c.Peers = Peers()
	}
	if c.Ops <= 0 {
		c.Ops = 400
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.Latency <= 0 {
		c.Latency = 50 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	return c
}

// KillPoint returns the number of finished operations after which the
// batch of c is killed: seeded, in the middle half of the batch.
func (c CrashConfig) KillPoint() int {
	c = c.withDefaults()
	r := rand.New(rand.NewPCG(c.Seed, 0x1de5))
	return c.Ops/4 + r.IntN(max(c.Ops/2, 1))
}

// CrashResult is one peer's crash and rerun.
type CrashResult struct {
	Peer string // the peer; the table's column, which a caller may relabel (a variant: "stripe-go (ietf errors)")
	Ops  int

	KillAt    int // finished operations recorded when the kill was set off (it follows half a reply latency later)
	Done      int // lines in the done-file when the batch died
	RanAtKill int // operations the server had run once the batch was gone
	// InFlight is RanAtKill - Done: operations that ran but that the
	// batch never recorded as done.
	InFlight int

	Resumed       int // idemhttp: pending entries Resume resent on restart
	RerunFailures int // operations the rerun reported failed

	// After the rerun: effects per operation.
	Ran0, Ran1, RanMore, Duplicates int
	Wall                            time.Duration
}

// Crash runs, for each peer, a batch of cfg.Ops operations in a child
// process (this program started again) that records each finished
// operation in a done-file and is SIGKILLed at a seeded point, then reruns
// the batch as a batch job would: skipping the operations the done-file
// lists. idemhttp's batch also journals every operation in a FileJournal
// under its operation id; its rerun resumes the journal first, then sends
// the rest with the same operation ids.
func Crash(ctx context.Context, cfg CrashConfig) ([]CrashResult, error) {
	cfg = cfg.withDefaults()
	dir, cleanup, err := workDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	out := make([]CrashResult, 0, len(cfg.Peers))
	for _, name := range cfg.Peers {
		r, err := crashPeer(ctx, name, cfg, dir)
		if err != nil {
			return out, fmt.Errorf("crash %s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// crashChildConfig is what the batch child is told, as JSON.
type crashChildConfig struct {
	Peer        string
	URL         string
	DoneFile    string
	Journal     string // "" for no journal
	Ops         int
	Concurrency int
	KillAt      int
	KillDelay   time.Duration // from the KillAt-th done to the kill
	Timeout     time.Duration
}

func crashPeer(ctx context.Context, name string, cfg CrashConfig, dir string) (CrashResult, error) {
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{Slow: 1, SlowDelay: cfg.Latency}})
	defer srv.Close()

	cc := crashChildConfig{
		Peer:        name,
		URL:         srv.URL,
		DoneFile:    filepath.Join(dir, "crash-"+name+".done"),
		Ops:         cfg.Ops,
		Concurrency: cfg.Concurrency,
		KillAt:      cfg.KillPoint(),
		KillDelay:   cfg.Latency / 2,
		Timeout:     cfg.Timeout,
	}
	if name == PeerIdem {
		cc.Journal = filepath.Join(dir, "crash-"+name+".journal")
	}
	for _, f := range []string{cc.DoneFile, cc.Journal} {
		if f != "" {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				return CrashResult{}, err
			}
		}
	}

	begin := time.Now()
	if err := runCrashChild(ctx, cc); err != nil {
		return CrashResult{}, err
	}
	done, err := readDone(cc.DoneFile)
	if err != nil {
		return CrashResult{}, err
	}
	r := CrashResult{Peer: name, Ops: cfg.Ops, KillAt: cc.KillAt, Done: len(done)}
	for _, n := range srv.Snapshot() {
		if n > 0 {
			r.RanAtKill++
		}
	}
	r.InFlight = r.RanAtKill - r.Done

	// The rerun, in this process: a batch job started again.
	pc := peerConfig{url: srv.URL, timeout: cfg.Timeout, withOp: true}
	var fj *filejournal.Journal
	if cc.Journal != "" {
		fj, err = filejournal.Open(cc.Journal, nil)
		if err != nil {
			return r, err
		}
		defer fj.Close()
		pc.journal = fj
	}
	p, err := newPeer(name, pc)
	if err != nil {
		return r, err
	}
	defer p.close()
	if p.idem != nil {
		resumed, err := p.idem.Resume(ctx, nil)
		if err != nil {
			return r, fmt.Errorf("resume: %w", err)
		}
		r.Resumed = len(resumed)
	}
	var rest []string
	for _, op := range opNames(cfg.Ops) {
		if !done[op] {
			rest = append(rest, op)
		}
	}
	for _, res := range runClosed(ctx, p, rest, cfg.Concurrency, nil) {
		if !res.ok() {
			r.RerunFailures++
		}
	}
	r.Wall = time.Since(begin)
	e := countEffects(opNames(cfg.Ops), srv.Snapshot())
	r.Ran0, r.Ran1, r.RanMore, r.Duplicates = e.ran0, e.ran1, e.ranMore, e.duplicates
	return r, nil
}

// runCrashChild runs the batch child and checks that it died by SIGKILL.
func runCrashChild(ctx context.Context, cc crashChildConfig) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd, err := childCommand(ctx, roleCrash, cc)
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	if err == nil {
		err = errors.New("exited normally")
	}
	return fmt.Errorf("batch child did not die at the kill point: %w; stderr: %s", err, stderr.String())
}

// readDone returns the operations a done-file lists.
func readDone(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	done := make(map[string]bool)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// A line cut short by the kill names no operation of the batch.
		if op := sc.Text(); op != "" {
			done[op] = true
		}
	}
	return done, sc.Err()
}

// crashChild is the batch process: it sends every operation, appends each
// finished one to the done-file, and SIGKILLs itself KillDelay (half the
// server's reply latency) after the KillAt-th is recorded. The workers
// finish their operations in waves, since every reply takes the same
// time; the delay puts the kill inside a wave's wait, when every worker
// has a request in flight that the server has run, instead of at a point
// within a wave of completions where some workers are between requests.
func crashChild(config string) int {
	var cc crashChildConfig
	if err := json.Unmarshal([]byte(config), &cc); err != nil {
		fmt.Fprintln(os.Stderr, "idembench crash child:", err)
		return 2
	}
	pc := peerConfig{url: cc.URL, timeout: cc.Timeout, withOp: true}
	if cc.Journal != "" {
		fj, err := filejournal.Open(cc.Journal, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, "idembench crash child:", err)
			return 2
		}
		defer fj.Close()
		pc.journal = fj
	}
	p, err := newPeer(cc.Peer, pc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench crash child:", err)
		return 2
	}
	defer p.close()
	// O_APPEND writes reach the page cache before write returns, so a
	// line survives the process's SIGKILL (not a machine crash: a batch
	// job that must survive one would sync, which changes nothing here).
	doneFile, err := os.OpenFile(cc.DoneFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "idembench crash child:", err)
		return 2
	}
	defer doneFile.Close()
	var (
		mu sync.Mutex
		n  int
	)
	runClosed(context.Background(), p, opNames(cc.Ops), cc.Concurrency, func(r opResult) {
		if !r.ok() {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		_, _ = doneFile.WriteString(r.op + "\n")
		n++
		if n == cc.KillAt {
			go func() {
				time.Sleep(cc.KillDelay)
				// SIGKILL on Unix, TerminateProcess on Windows: no
				// deferred call, no flush.
				if p, err := os.FindProcess(os.Getpid()); err == nil {
					_ = p.Kill()
				}
			}()
		}
	})
	// Reached only if the batch ends before the kill, which the parent
	// reports as an error.
	return 0
}
