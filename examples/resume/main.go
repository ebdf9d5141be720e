// Command resume shows a batch job surviving a crash without charging anyone
// twice or forgetting anyone.
//
// It starts a local fake payments API (idemtest, which deduplicates by
// Idempotency-Key and counts the charges it executes per operation), then
// runs itself again as a child process: the batch job. The child sends 200
// charges, charge-0001 to charge-0200, eight at a time, each named with
// idemhttp.WithOperation and journaled in a filejournal.Journal before its first
// byte leaves. Halfway through, with requests in flight, the child is
// SIGKILLed just after a response arrives and before it is recorded: the
// worst moment, since the charge ran and the job does not know it.
//
// The parent then does what a restarted job does: it reopens the journal,
// calls Client.Resume, which resends every pending entry with its original
// key (a charge that ran is replayed, not run again), and reruns the whole
// batch, in which operations already done send nothing: Do returns an
// *idemhttp.DoneError (errors.Is ErrAlreadyDone) with the key, the status
// and the attempts the journal recorded, not the response. (Done is done:
// the client does not ask the server again, within its key retention or
// past it.) A client with Policy.KeepResults set gets the response back
// instead: the journal keeps a copy with the done entry, and the rerun's
// Do returns it as a replay (idemhttp.Replayed true), still sending
// nothing; examples/saga does that. Finally it asks the server how often
// each charge ran and exits non-zero if any ran twice or never.
//
//	go run ./examples/resume
//
// It runs offline, in a temporary directory it removes.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
)

const (
	batchSize = 200 // charges in the batch
	workers   = 8   // charges in flight at once
	crashAt   = 100 // the child dies on receiving this response

	// The child learns its role, its journal and the server from these.
	envJournal = "IDEMHTTP_RESUME_JOURNAL"
	envURL     = "IDEMHTTP_RESUME_URL"
)

func main() {
	if path := os.Getenv(envJournal); path != "" {
		os.Exit(child(path, os.Getenv(envURL)))
	}
	os.Exit(parent())
}

// parent runs the demonstration and returns the exit code: non-zero if
// any charge ran twice or never.
func parent() int {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := run(ctx, os.Args[0], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "resume:", err)
		return 1
	}
	if !rep.ok() {
		fmt.Println("FAIL: some charge ran twice, never ran, or did not end in 200")
		return 1
	}
	fmt.Println("OK: every charge ran exactly once")
	return 0
}

// report is what a run found.
type report struct {
	Operations int

	ExecutedAtCrash   int // charges the server had executed when the child died
	JournalDone       int // entries the child recorded as done
	JournalPending    int // entries begun whose outcome the child never learnt
	Resumed           int // pending entries Resume resent
	ResumeReplayed    int // ... that the server had run before the crash
	ResumeExecuted    int // ... that had never reached it
	ResumeFailed      int // ... that Resume could not resolve
	RerunDone         int // rerun operations the journal had done: nothing sent
	RerunExecuted     int // rerun operations the server ran for the first time
	RerunFailed       int // rerun operations without a 200
	PendingAfterRerun int // entries still pending at the end
	ExecutedOnce      int // operations the server ran exactly once
	Duplicates        int // executions beyond the first, over all operations
	Lost              int // operations the server never ran
	Requests          int // requests the server received, from both processes
}

func (r report) ok() bool {
	return r.Duplicates == 0 && r.Lost == 0 && r.ResumeFailed == 0 && r.RerunFailed == 0 &&
		r.PendingAfterRerun == 0 && r.ExecutedOnce == r.Operations
}

// run is the parent: it starts the server, runs the batch job in a child
// process (self, with the child's environment) that dies mid-batch, then
// resumes, reruns and counts. It writes the report to w.
func run(ctx context.Context, self string, w io.Writer) (report, error) {
	rep := report{Operations: batchSize}
	// A charge of the dead child may still be running on the server when
	// Resume resends its key: the server then answers 409 (in progress)
	// with this Retry-After, and the client waits that long and retries.
	srv := idemtest.NewServer(&idemtest.Options{Faults: idemtest.Faults{RetryAfter: time.Second}})
	defer srv.Close()
	dir, err := os.MkdirTemp("", "idemhttp-resume-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal.db")

	fmt.Fprintf(w, "batch:   %d charges, %d in flight, journaled in %s\n", batchSize, workers, path)
	if err := runChild(ctx, self, path, srv.URL); err != nil {
		return rep, err
	}
	rep.ExecutedAtCrash = srv.Stats().Executions
	fmt.Fprintf(w, "crash:   the batch process was SIGKILLed on receiving response %d; the server had executed %d charges\n",
		crashAt, rep.ExecutedAtCrash)

	// The restart.
	fj, err := filejournal.Open(path, nil)
	if err != nil {
		return rep, err
	}
	defer fj.Close()
	entries, err := fj.Entries(ctx)
	if err != nil {
		return rep, err
	}
	for _, e := range entries {
		switch e.State {
		case idemhttp.StateDone:
			rep.JournalDone++
		case idemhttp.StatePending:
			rep.JournalPending++
		}
	}
	fmt.Fprintf(w, "journal: %d done, %d pending (begun, outcome unknown to the job)\n", rep.JournalDone, rep.JournalPending)

	c := &idemhttp.Client{HTTPClient: srv.Client(), Journal: fj}
	results, err := c.Resume(ctx, nil)
	if err != nil {
		return rep, err
	}
	for _, r := range results {
		rep.Resumed++
		switch {
		case r.Err != nil || r.StatusCode != http.StatusOK:
			rep.ResumeFailed++
			fmt.Fprintf(w, "         resume %s: status %d: %v\n", r.Entry.Operation, r.StatusCode, r.Err)
		case r.Replayed:
			rep.ResumeReplayed++
		default:
			rep.ResumeExecuted++
		}
	}
	fmt.Fprintf(w, "resume:  %d entries resent with their original keys: %d replayed (ran before the crash), %d executed (never arrived), %d failed\n",
		rep.Resumed, rep.ResumeReplayed, rep.ResumeExecuted, rep.ResumeFailed)

	for _, o := range sendBatch(ctx, c, srv.URL) {
		switch {
		case o.err != nil || o.status != http.StatusOK:
			rep.RerunFailed++
			fmt.Fprintf(w, "         rerun %s: status %d: %v\n", o.op, o.status, o.err)
		case o.done:
			rep.RerunDone++
		default:
			rep.RerunExecuted++
		}
	}
	fmt.Fprintf(w, "rerun:   %d charges: %d already done (the journal says so: nothing sent), %d executed (never begun), %d failed\n",
		batchSize, rep.RerunDone, rep.RerunExecuted, rep.RerunFailed)

	pending, err := fj.Pending(ctx)
	if err != nil {
		return rep, err
	}
	rep.PendingAfterRerun = len(pending)
	executions := srv.Snapshot()
	for i := 1; i <= batchSize; i++ {
		switch n := executions[opID(i)]; {
		case n == 0:
			rep.Lost++
		case n == 1:
			rep.ExecutedOnce++
		default:
			rep.Duplicates += n - 1
		}
	}
	rep.Requests = srv.Stats().Requests
	fmt.Fprintf(w, "server:  %d charges, %d executed once, %d duplicates, %d lost (%d requests received, %d entries still pending)\n",
		batchSize, rep.ExecutedOnce, rep.Duplicates, rep.Lost, rep.Requests, rep.PendingAfterRerun)
	return rep, nil
}

// runChild runs the batch job as a child process, which must die of
// SIGKILL.
func runChild(ctx context.Context, self, path, url string) error {
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), envJournal+"="+path, envURL+"="+url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("the batch process was not killed (err %v), output:\n%s", err, out.String())
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("the batch process ended with %v, not SIGKILL, output:\n%s", err, out.String())
	}
	return nil
}

// child is the batch job. It never finishes: the transport kills the
// process on the crashAt-th response.
func child(path, url string) int {
	fj, err := filejournal.Open(path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer fj.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Transport: &crashingTransport{rt: tr, at: crashAt}},
		Journal:    fj,
	}
	sendBatch(context.Background(), c, url)
	fmt.Fprintln(os.Stderr, "child: the batch finished without crashing")
	return 3
}

// crashingTransport kills its process with SIGKILL on receiving its at-th
// response: the server has run the request, and the client will never
// record that it did.
type crashingTransport struct {
	rt http.RoundTripper
	at int64
	n  atomic.Int64
}

func (t *crashingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && t.n.Add(1) == t.at {
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Kill() // SIGKILL: no deferred call, no flush, no goodbye
		select {}
	}
	return resp, err
}

// outcome is how one charge of a batch ended.
type outcome struct {
	op       string
	status   int
	replayed bool
	done     bool // the journal had it done: nothing was sent
	err      error
}

// sendBatch sends every charge of the batch once through c, workers at a
// time, as a batch job does.
func sendBatch(ctx context.Context, c *idemhttp.Client, url string) []outcome {
	out := make([]outcome, batchSize)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				out[i-1] = charge(ctx, c, url, i)
			}
		})
	}
	for i := 1; i <= batchSize; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// charge sends charge i: the operation id names it, so the journal gives a
// rerun the key the first run used.
func charge(ctx context.Context, c *idemhttp.Client, url string, i int) outcome {
	o := outcome{op: opID(i)}
	body := fmt.Sprintf(`{"operation":%q,"amount":%d,"currency":"eur"}`, o.op, 1000+i)
	req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, o.op), http.MethodPost, url+"/v1/charges", strings.NewReader(body))
	if err != nil {
		o.err = err
		return o
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	var done *idemhttp.DoneError
	if errors.As(err, &done) {
		o.status, o.done = done.Status, true
		return o
	}
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	_, o.err = io.Copy(io.Discard, resp.Body)
	o.status, o.replayed = resp.StatusCode, idemhttp.Replayed(resp)
	return o
}

func opID(i int) string { return fmt.Sprintf("charge-%04d", i) }
