package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// TestMain doubles as the job process: runChild re-executes the test
// binary, as the command re-executes itself, with the child's environment.
func TestMain(m *testing.M) {
	if path := os.Getenv(envJournal); path != "" {
		os.Exit(child(path))
	}
	goleak.VerifyTestMain(m)
}

// scenario is a job and the steps it takes.
type scenario struct {
	name    string
	order   Order
	steps   []string
	outcome string
}

var scenarios = []scenario{
	{"in stock", Order{ID: "job-in", Amount: 1200, SKU: "mug", Email: "ada@example.com"}, []string{stepCharge, stepReserve, stepReceipt}, outcomeCompleted},
	{"out of stock", Order{ID: "job-out", Amount: 3400, SKU: "teapot", Email: "bob@example.com"}, []string{stepCharge, stepReserve, stepRefund}, outcomeCompensated},
}

// TestKilledEverywhere kills the job with SIGKILL inside every step (after
// the journal has its entry and before the request leaves; after the
// service answered and before the job learned it) and between every two
// (right after a step returned, with its outcome perhaps not yet durable;
// and once it was), then reruns it, twice. Every effect of the outcome
// runs exactly once, the refund only when the stock was gone and at most
// once, the later steps use the objects the earlier ones created (the
// refund the first run's charge id), and the second rerun executes
// nothing. The journal keeps each done step's result (Policy.KeepResults),
// and the reruns send nothing at all for a step done before the kill.
//
// Checked: with the charge's operation named per run (a new key every
// run), every case charges twice; with the refund's named per run, every
// out-of-stock case fails (a rerun refunds again; the service refuses,
// already refunded, and the job stops); with KeepResults 0, every case
// with a step done before the kill fails (the rerun asks the service
// again, RefetchDone).
func TestKilledEverywhere(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a child process per kill point")
	}
	for _, sc := range scenarios {
		for _, step := range sc.steps {
			for _, how := range []string{"unsent", "answered", "after", "synced"} {
				kill := how + ":" + step
				t.Run(sc.name+"/"+kill, func(t *testing.T) {
					killedAndRerun(t, sc, kill)
				})
			}
		}
	}
}

func killedAndRerun(t *testing.T, sc scenario, kill string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc := newServices(map[string]int{"mug": 5})
	defer svc.close()
	journal := filepath.Join(t.TempDir(), "journal")
	job := sc.order.ID

	require.NoError(t, runChild(ctx, os.Args[0], journal, svc.urls(), sc.order, kill))
	atKill := svc.counts()
	doneAtKill := doneSteps(t, journal, job)

	first, err := rerun(ctx, journal, svc.urls(), sc.order)
	require.NoError(t, err)
	afterFirst := svc.counts()
	second, err := rerun(ctx, journal, svc.urls(), sc.order)
	require.NoError(t, err)
	afterSecond := svc.counts()

	assert.Equal(t, sc.outcome, first.Outcome, "%s", describe(first))
	assert.Equal(t, sc.outcome, second.Outcome, "%s", describe(second))
	assert.True(t, exactlyOnce(afterSecond, job, sc.outcome), "effects %v", afterSecond.effects)
	assert.Equal(t, afterFirst.effects, afterSecond.effects, "the second rerun executes nothing")
	// The later steps ran with what the earlier ones created, whichever
	// run made them.
	charge := afterSecond.created[job+"/"+stepCharge]
	switch sc.outcome {
	case outcomeCompleted:
		assert.Equal(t, charge, afterSecond.used[job+"/"+stepReceipt].Charge)
		assert.Equal(t, afterSecond.created[job+"/"+stepReserve], afterSecond.used[job+"/"+stepReceipt].Reservation)
	case outcomeCompensated:
		assert.Equal(t, charge, afterSecond.used[job+"/"+stepRefund].Charge, "the refund undoes the first run's charge")
	}
	// A step the journal had done before the kill kept its result, and
	// is not asked for again.
	for step, kept := range doneAtKill {
		op := job + "/" + step
		assert.True(t, kept, "%s: done without its result kept", op)
		assert.Equal(t, atKill.requests[op], afterSecond.requests[op], "%s: the reruns sent nothing for a done step", op)
	}
}

// doneSteps returns the steps of job the journal has done, and whether it
// kept each one's result.
func doneSteps(t *testing.T, journal, job string) map[string]bool {
	t.Helper()
	fj, err := filejournal.Open(journal, &filejournal.Options{ReadOnly: true})
	require.NoError(t, err)
	defer fj.Close()
	done := map[string]bool{}
	for _, step := range []string{stepCharge, stepReserve, stepReceipt, stepRefund} {
		e, err := fj.Lookup(context.Background(), job+"/"+step)
		if err != nil || e.State != idemhttp.StateDone {
			continue
		}
		full, err := fj.Get(context.Background(), e.Key)
		require.NoError(t, err)
		done[step] = full.Result != nil
	}
	return done
}

// TestUnknownOutcomeNeverCompensates: when the reservation's outcome is
// unknown (the inventory runs it and the answer is lost, again and again,
// until the client gives up), the job stops and refunds nothing: the
// stock may be reserved. A rerun, once the answers arrive again, gets the
// reservation replayed and completes. Checked: with Run compensating on
// any reservation error, the first run refunds and this fails.
func TestUnknownOutcomeNeverCompensates(t *testing.T) {
	ctx := context.Background()
	svc := newServices(map[string]int{"mug": 5})
	defer svc.close()
	fj, err := filejournal.Open(filepath.Join(t.TempDir(), "journal"), nil)
	require.NoError(t, err)
	defer fj.Close()
	o := Order{ID: "job-lost", Amount: 900, SKU: "mug", Email: "cy@example.com"}
	svc.inventory.mu.Lock()
	svc.inventory.dropAnswers = 100
	svc.inventory.mu.Unlock()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	s := &Saga{Client: newClient(fj, tr), Services: svc.urls()}

	first := s.Run(ctx, o)
	svc.inventory.mu.Lock()
	svc.inventory.dropAnswers = 0
	svc.inventory.mu.Unlock()
	again := s.Run(ctx, o)

	assert.Equal(t, outcomeStopped, first.Outcome, describe(first))
	assert.Contains(t, first.Err, stepReserve)
	assert.Equal(t, outcomeCompleted, again.Outcome, describe(again))
	c := svc.counts()
	assert.True(t, exactlyOnce(c, o.ID, outcomeCompleted), "effects %v", c.effects)
	assert.Zero(t, c.effects[o.ID+"/"+stepRefund], "never a refund on an unknown outcome")
}

// TestDemo runs the command's demonstration.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out bytes.Buffer
	ok, err := demo(ctx, os.Args[0], &out)
	require.NoError(t, err, out.String())
	assert.True(t, ok, out.String())
	assert.Contains(t, out.String(), "order-1: 1500 cents")
	assert.Contains(t, out.String(), "=> completed")
	assert.Contains(t, out.String(), "=> compensated")
	t.Log("\n" + out.String())
}

func ExampleSaga() {
	svc := newServices(map[string]int{"mug": 1})
	defer svc.close()
	dir, err := os.MkdirTemp("", "saga-example-")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	fj, err := filejournal.Open(filepath.Join(dir, "journal"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fj.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	s := &Saga{Client: newClient(fj, tr), Services: svc.urls()}

	for _, o := range []Order{
		{ID: "order-7", Amount: 1500, SKU: "mug", Email: "ada@example.com"},
		{ID: "order-8", Amount: 1500, SKU: "mug", Email: "bob@example.com"}, // the last mug is gone
	} {
		rep := s.Run(context.Background(), o)
		fmt.Println(rep.Job, rep.Outcome)
		for _, st := range rep.Steps {
			fmt.Printf("  %s %d %s\n", st.Step, st.Status, st.Source)
		}
	}
	// Output:
	// order-7 completed
	//   charge 200 sent
	//   reserve 200 sent
	//   receipt 200 sent
	// order-8 compensated
	//   charge 200 sent
	//   reserve 409 sent
	//   refund 200 sent
}

// TestRerunReusesResults: with a journal that keeps results (here the
// client's in-memory one, in one process), a job
// stopped after its charge reruns with the charge from the journal: no
// request for it, the refund made with its id; and a third run sends
// nothing at all. Checked: with KeepResults 0, the reruns ask the
// payments service again (RefetchDone) and this fails.
func TestRerunReusesResults(t *testing.T) {
	svc := newServices(nil) // no stock: the job compensates
	defer svc.close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	s := &Saga{Client: newClient(nil, tr), Services: svc.urls()}
	o := Order{ID: "job-mem", Amount: 700, SKU: "mug", Email: "di@example.com"}
	ctx, stop := context.WithCancel(context.Background())
	s.AfterStep = func(_, step string) {
		if step == stepCharge {
			stop() // the process "dies" between the charge and the reservation
		}
	}

	first := s.Run(ctx, o)
	s.AfterStep = nil
	afterFirst := svc.counts()
	second := s.Run(context.Background(), o)
	afterSecond := svc.counts()
	third := s.Run(context.Background(), o)
	afterThird := svc.counts()

	require.Equal(t, outcomeStopped, first.Outcome, describe(first))
	require.Equal(t, outcomeCompensated, second.Outcome, describe(second))
	assert.Equal(t, "journal", second.Steps[0].Source, "the charge comes from the journal")
	assert.Equal(t, afterFirst.requests["job-mem/charge"], afterSecond.requests["job-mem/charge"], "nothing sent for the charge")
	assert.Equal(t, afterSecond.created["job-mem/charge"], afterSecond.used["job-mem/refund"].Charge)
	assert.Equal(t, outcomeCompensated, third.Outcome, describe(third))
	for _, st := range third.Steps {
		assert.Equal(t, "journal", st.Source, st.Step)
	}
	assert.Equal(t, afterSecond.requests, afterThird.requests, "the third run sends nothing")
	assert.True(t, exactlyOnce(afterThird, o.ID, outcomeCompensated), "effects %v", afterThird.effects)
}
