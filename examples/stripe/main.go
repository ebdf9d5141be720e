// Command stripe shows a stripe-go batch job surviving a crash without
// charging anyone twice or forgetting anyone.
//
// stripe-go sends its HTTP through idemhttp: its *http.Client is
// [idemhttp.Client.StandardClient], its own retries are off
// (MaxNetworkRetries 0, so idemhttp's Policy alone decides), and each
// charge runs under [idemhttp.WithOperation] with a [filejournal.Journal].
// stripe-go mints a new Idempotency-Key on every call; under WithOperation
// the journal's key for the operation wins, so a rerun of a charge resends
// the key of its first run and the server replays instead of charging
// again.
//
// It starts a local fake Stripe (idemtest with Stripe's error shapes,
// which counts the charges it executes per operation), then runs itself as
// a child process: the batch job, 60 charges, 6 at a time. The child is
// SIGKILLed on receiving its 30th response, just before recording it: the
// charge ran and the job does not know. The parent then reruns the same
// batch through stripe-go, as a restarted job does, and asks the server
// how often each charge ran; the exit code is 1 if any ran twice or never.
//
//	cd examples/stripe && go run .
//
// It runs offline, in a temporary directory it removes, in a second or two.
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtest"
	"github.com/stripe/stripe-go/v82"
)

const (
	batchSize = 60 // charges in the batch
	workers   = 6  // charges in flight at once
	crashAt   = 30 // the child dies on receiving this response

	// The child learns its role, its journal and the server from these.
	envJournal = "IDEMHTTP_STRIPE_JOURNAL"
	envURL     = "IDEMHTTP_STRIPE_URL"
)

func main() {
	if path := os.Getenv(envJournal); path != "" {
		os.Exit(child(path, os.Getenv(envURL)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := run(ctx, os.Args[0], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stripe:", err)
		os.Exit(1)
	}
	if !rep.ok() {
		fmt.Println("FAIL: some charge ran twice, never ran, or failed")
		os.Exit(1)
	}
	fmt.Println("OK: every charge ran exactly once")
}

// report is what a run found.
type report struct {
	Operations      int
	ExecutedAtCrash int // charges the server had executed when the child died
	JournalPending  int // entries the child began and never learnt the outcome of
	RerunDone       int // rerun charges the journal had done: nothing sent
	RerunReplayed   int // rerun charges answered from the server's store
	RerunExecuted   int // rerun charges the server ran for the first time
	RerunFailed     int // rerun charges that returned an error
	ExecutedOnce    int // charges the server ran exactly once
	Duplicates      int // executions beyond the first, over all charges
	Lost            int // charges the server never ran
}

func (r report) ok() bool {
	return r.Duplicates == 0 && r.Lost == 0 && r.RerunFailed == 0 && r.ExecutedOnce == r.Operations
}

// run is the parent: it starts the fake Stripe, runs the batch in a child
// process (self) that dies mid-batch, reruns the batch and counts.
func run(ctx context.Context, self string, w io.Writer) (report, error) {
	rep := report{Operations: batchSize}
	// A charge of the dead child may still be running when the rerun
	// resends its key: the server answers 409 with this Retry-After.
	srv := idemtest.NewServer(&idemtest.Options{StripeErrors: true, RequireKey: true, Faults: idemtest.Faults{RetryAfter: time.Second}})
	defer srv.Close()
	dir, err := os.MkdirTemp("", "idemhttp-stripe-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal")

	fmt.Fprintf(w, "batch:   %d stripe-go charges, %d in flight, journaled in %s\n", batchSize, workers, path)
	if err := runChild(ctx, self, path, srv.URL); err != nil {
		return rep, err
	}
	rep.ExecutedAtCrash = srv.Stats().Executions
	fmt.Fprintf(w, "crash:   the batch process was SIGKILLed on receiving response %d; the server had executed %d charges\n", crashAt, rep.ExecutedAtCrash)

	fj, err := filejournal.Open(path, nil)
	if err != nil {
		return rep, err
	}
	defer fj.Close()
	pending, err := fj.Pending(ctx)
	if err != nil {
		return rep, err
	}
	rep.JournalPending = len(pending)
	fmt.Fprintf(w, "journal: %d charges pending (begun, outcome unknown to the job)\n", rep.JournalPending)

	// The restart: the same batch, the same code, the same journal.
	c := &idemhttp.Client{HTTPClient: srv.Client(), Journal: fj, Policy: idemhttp.StripePolicy()}
	for _, o := range sendBatch(ctx, newStripe(srv.URL, c)) {
		switch {
		case o.err != nil:
			rep.RerunFailed++
			fmt.Fprintf(w, "         rerun %s: %v\n", o.op, o.err)
		case o.done:
			rep.RerunDone++
		case o.replayed:
			rep.RerunReplayed++
		default:
			rep.RerunExecuted++
		}
	}
	fmt.Fprintf(w, "rerun:   %d charges: %d already done (nothing sent), %d replayed (ran before, journaled key resent), %d executed (never ran), %d failed\n",
		batchSize, rep.RerunDone, rep.RerunReplayed, rep.RerunExecuted, rep.RerunFailed)

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
	fmt.Fprintf(w, "server:  %d charges, %d executed once, %d duplicates, %d lost\n", batchSize, rep.ExecutedOnce, rep.Duplicates, rep.Lost)
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

// child is the batch job. It never finishes: its transport kills the
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
		Policy:     idemhttp.StripePolicy(),
	}
	sendBatch(context.Background(), newStripe(url, c))
	fmt.Fprintln(os.Stderr, "child: the batch finished without crashing")
	return 3
}

// newStripe returns a stripe-go client whose HTTP goes through c, with
// stripe-go's own retries off: idemhttp's Policy decides, once.
func newStripe(url string, c *idemhttp.Client) *stripe.Client {
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:        c.StandardClient(),
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return stripe.NewClient("sk_test_example", stripe.WithBackends(backends))
}

// crashingTransport kills its process with SIGKILL on receiving its at-th
// response: the server has run the charge, and the job will never record
// that it did.
type crashingTransport struct {
	rt http.RoundTripper
	at int64
	n  atomic.Int64
}

func (t *crashingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err == nil && t.n.Add(1) == t.at {
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Kill() // SIGKILL: no deferred call, no flush
		select {}
	}
	return resp, err
}

// outcome is how one charge ended.
type outcome struct {
	op       string
	replayed bool
	done     bool // the journal had it done: nothing was sent
	err      error
}

// sendBatch creates every charge of the batch once through sc, workers at
// a time.
func sendBatch(ctx context.Context, sc *stripe.Client) []outcome {
	out := make([]outcome, batchSize)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				out[i-1] = charge(ctx, sc, i)
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

// charge creates charge i. WithOperation names it: the journal gives a
// rerun the key of the first run, whatever key stripe-go mints this time.
// The metadata names it too, for the fake server's count.
func charge(ctx context.Context, sc *stripe.Client, i int) outcome {
	o := outcome{op: opID(i)}
	params := &stripe.ChargeCreateParams{
		Amount:   stripe.Int64(int64(1000 + i)),
		Currency: stripe.String(string(stripe.CurrencyEUR)),
		Source:   &stripe.PaymentSourceSourceParams{Token: stripe.String("tok_visa")},
	}
	params.AddMetadata("operation", o.op)
	ch, err := sc.V1Charges.Create(idemhttp.WithOperation(ctx, o.op), params)
	var done *idemhttp.DoneError
	if errors.As(err, &done) {
		o.done = true // the journal has it done: idemhttp sent nothing
		return o
	}
	if err != nil {
		o.err = err
		return o
	}
	if ch.LastResponse != nil {
		o.replayed = ch.LastResponse.Header.Get("Idempotent-Replayed") == "true"
	}
	return o
}

func opID(i int) string { return fmt.Sprintf("charge-%04d", i) }
