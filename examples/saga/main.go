// Command saga runs a job of several keyed calls, a saga: charge the
// customer, reserve the stock, send the receipt; and when the stock is
// gone, refund the charge instead. Each step is one idemhttp call under an
// operation named after the job and the step (WithOperation(ctx,
// "order-1/charge")), journaled before its first byte leaves; the refund,
// the compensation, is a keyed call of its own ("order-1/refund"). The
// client keeps each done step's response in the journal
// (Policy.KeepResults), so a rerun reuses the earlier steps' results (the
// charge id that the refund and the receipt need) instead of asking for
// them again, and sends nothing for them.
//
// It starts three fake services on loopback (payments, inventory, a
// mailer, each behind idemserver.Middleware, counting what they execute),
// then runs two jobs in a child process that it SIGKILLs in the middle:
// one after the server answered the reservation and before the job
// learned it, one between the charge and the reservation. It reruns both
// jobs, prints what each run did step by step and what the services
// executed, and exits non-zero if any effect ran twice, went missing, or
// a compensation ran when it should not.
//
//	go run ./examples/saga
//
// What this gives: every step runs at most once, a done step is never
// sent again (its result comes from the journal), the compensation runs
// at most once and only after a step failed for good (a definite, stored
// answer), never on an unknown outcome; a rerun finishes the job, forwards
// or backwards. What it does not give: isolation (between the charge and
// the refund, anyone can see the customer charged, and a stock count read
// by another job may change under it); ordering between jobs; atomicity in
// time (a job killed half-way stays half done until someone reruns it:
// within the services' key retention, since a step pending longer is not
// resent); a refund is a new operation that undoes the charge's effect on
// the balance, not a rollback (fees, statements and e-mails stay). See
// the README's "Multi-step jobs".
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// The child learns its role from these: the journal, the services' URLs,
// the order and where to die.
const (
	envJournal  = "IDEMHTTP_SAGA_JOURNAL"
	envServices = "IDEMHTTP_SAGA_SERVICES"
	envOrder    = "IDEMHTTP_SAGA_ORDER"
	envKill     = "IDEMHTTP_SAGA_KILL"
)

// keepResults bounds the responses the journal keeps: the services'
// objects are a few hundred bytes.
const keepResults = 16 << 10

func main() {
	if path := os.Getenv(envJournal); path != "" {
		os.Exit(child(path))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok, err := demo(ctx, os.Args[0], os.Stdout)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "saga:", err)
		os.Exit(1)
	case !ok:
		fmt.Println("FAIL: an effect ran twice or not at all, or a compensation ran when it should not")
		os.Exit(1)
	}
	fmt.Println("OK: every effect executed exactly once, the refund only where the stock was gone")
}

// newClient returns the client every run of a job uses, over journal j.
func newClient(j idemhttp.Journal, rt http.RoundTripper) *idemhttp.Client {
	return &idemhttp.Client{
		HTTPClient: &http.Client{Transport: rt, Timeout: 5 * time.Second},
		Journal:    j,
		Policy: &idemhttp.Policy{
			// A done step's response is kept with its journal entry, and a
			// rerun gets it back without sending anything.
			KeepResults: keepResults,
			// A done step whose response was not kept (larger than
			// KeepResults, or journaled by a build that kept none) is
			// asked again, under its key and within the retention, and
			// the service replays it. Past the retention the job stops
			// (errNoResult) rather than risk a second charge.
			RefetchDone: true,
			BaseDelay:   10 * time.Millisecond,
		},
	}
}

// demo runs the two jobs, each killed once and rerun, and reports.
func demo(ctx context.Context, self string, w io.Writer) (bool, error) {
	svc := newServices(map[string]int{"mug": 10})
	defer svc.close()
	dir, err := os.MkdirTemp("", "idemhttp-saga-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	journal := filepath.Join(dir, "journal")

	jobs := []struct {
		order Order
		kill  string
		want  string
	}{
		{Order{ID: "order-1", Amount: 1500, SKU: "mug", Email: "ada@example.com"}, "answered:" + stepReserve, outcomeCompleted},
		{Order{ID: "order-2", Amount: 2500, SKU: "teapot", Email: "bob@example.com"}, "synced:" + stepCharge, outcomeCompensated},
	}
	ok := true
	for _, job := range jobs {
		fmt.Fprintf(w, "%s: %d cents of %s for %s; the job is SIGKILLed %s\n", job.order.ID, job.order.Amount, job.order.SKU, job.order.Email, describeKill(job.kill))
		if err := runChild(ctx, self, journal, svc.urls(), job.order, job.kill); err != nil {
			return false, err
		}
		before := svc.counts()
		fmt.Fprintf(w, "  killed: the services had executed %s\n", effectsOf(before, job.order.ID))
		rep, err := rerun(ctx, journal, svc.urls(), job.order)
		if err != nil {
			return false, err
		}
		fmt.Fprintf(w, "  rerun: %s\n", describe(rep))
		after := svc.counts()
		fmt.Fprintf(w, "  now: %s\n", effectsOf(after, job.order.ID))
		ok = ok && rep.Outcome == job.want && exactlyOnce(after, job.order.ID, job.want)
	}
	return ok, nil
}

// rerun runs the job again in this process, as a restarted job does: it
// reopens the journal and runs the job from the start.
func rerun(ctx context.Context, journal string, urls Services, o Order) (Report, error) {
	fj, err := filejournal.Open(journal, nil)
	if err != nil {
		return Report{}, err
	}
	s := &Saga{Client: newClient(fj, http.DefaultTransport), Services: urls}
	rep := s.Run(ctx, o)
	return rep, fj.Close()
}

// exactlyOnce reports whether the services executed each effect of the
// job's outcome once and nothing else.
func exactlyOnce(c counts, job, outcome string) bool {
	want := map[string]int{job + "/" + stepCharge: 1}
	switch outcome {
	case outcomeCompleted:
		want[job+"/"+stepReserve], want[job+"/"+stepReceipt] = 1, 1
	case outcomeCompensated:
		want[job+"/"+stepRefund] = 1
	}
	for _, step := range []string{stepCharge, stepReserve, stepReceipt, stepRefund} {
		op := job + "/" + step
		if c.effects[op] != want[op] {
			return false
		}
	}
	return true
}

// effectsOf renders the job's effects: "charge 1, reserve 0, ...".
func effectsOf(c counts, job string) string {
	var parts []string
	for _, step := range []string{stepCharge, stepReserve, stepReceipt, stepRefund} {
		parts = append(parts, fmt.Sprintf("%s %d", step, c.effects[job+"/"+step]))
	}
	return strings.Join(parts, ", ")
}

// describe renders a run: each step, its status and where its answer
// came from, then the outcome.
func describe(rep Report) string {
	var parts []string
	for _, st := range rep.Steps {
		from := map[string]string{"journal": "from the journal, nothing sent", "replay": "sent again, the service replayed it", "sent": "sent"}[st.Source]
		id := st.ID
		if id == "" {
			id = fmt.Sprint(st.Status)
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s)", st.Step, id, from))
	}
	s := strings.Join(parts, "; ") + " => " + rep.Outcome
	if rep.Err != "" {
		s += ": " + rep.Err
	}
	return s
}

func describeKill(kill string) string {
	how, step, _ := strings.Cut(kill, ":")
	switch how {
	case "unsent":
		return "inside " + step + ", before its request left"
	case "answered":
		return "inside " + step + ", after the service answered and before the job learned it"
	case "after":
		return "between steps, just after " + step + " returned"
	case "synced":
		return "between steps, once " + step + "'s outcome was durable"
	}
	return kill
}

// runChild runs the job in a child process (self, with the child's
// environment) that must die of SIGKILL at kill.
func runChild(ctx context.Context, self, journal string, urls Services, o Order, kill string) error {
	u, err := json.Marshal(urls)
	if err != nil {
		return err
	}
	ob, err := json.Marshal(o)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), envJournal+"="+journal, envServices+"="+string(u), envOrder+"="+string(ob), envKill+"="+kill)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("the job was not killed (err %v), output:\n%s", err, out.String())
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("the job ended with %v, not SIGKILL, output:\n%s", err, out.String())
	}
	return nil
}

// child is the job process: it runs the job and kills itself at the
// point envKill names. It never finishes.
func child(journal string) int {
	var urls Services
	var o Order
	if err := errors.Join(json.Unmarshal([]byte(os.Getenv(envServices)), &urls), json.Unmarshal([]byte(os.Getenv(envOrder)), &o)); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	how, at, _ := strings.Cut(os.Getenv(envKill), ":")
	fj, err := filejournal.Open(journal, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	defer fj.Close()
	s := &Saga{Client: newClient(fj, &killingTransport{rt: http.DefaultTransport, how: how, path: pathOf(at)}), Services: urls}
	if how == "after" || how == "synced" {
		s.AfterStep = func(_, step string) {
			if step != at {
				return
			}
			if how == "synced" {
				// The step's outcome made durable first: Finish writes
				// behind, and a kill right after Do returns may lose it
				// (the rerun then resends the step, and the service
				// replays it).
				_ = fj.Sync(context.Background())
			}
			killSelf()
		}
	}
	rep := s.Run(context.Background(), o)
	fmt.Fprintf(os.Stderr, "child: the job ended without being killed: %+v\n", rep)
	return 3
}

// pathOf is the request path of a step.
func pathOf(step string) string {
	return map[string]string{stepCharge: "/v1/charges", stepReserve: "/v1/reservations", stepReceipt: "/v1/receipts", stepRefund: "/v1/refunds"}[step]
}

// killingTransport kills the process at a step's request: before it is
// sent ("unsent", after the journal has its entry) or once the service
// has answered it ("answered": the effect happened, and the job will
// never learn it).
type killingTransport struct {
	rt   http.RoundTripper
	how  string
	path string
}

func (t *killingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != t.path {
		return t.rt.RoundTrip(r)
	}
	if t.how == "unsent" {
		killSelf()
	}
	resp, err := t.rt.RoundTrip(r)
	if t.how == "answered" && err == nil {
		_, _ = io.Copy(io.Discard, resp.Body) // the whole answer arrived
		killSelf()
	}
	return resp, err
}

// killSelf ends the process at once, as kill -9 does: no deferred call,
// no flush, no goodbye.
func killSelf() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		_ = p.Kill()
	}
	select {}
}
