package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemkit/idemhttp"
)

// Services are the base URLs of the APIs a job calls.
type Services struct {
	Payments  string // POST /v1/charges, POST /v1/refunds
	Inventory string // POST /v1/reservations
	Mailer    string // POST /v1/receipts
}

// Order is a job's input. Its ID names the job: every step's operation
// is ID + "/" + the step's name, so a rerun of the job finds each step
// in the journal.
type Order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	SKU    string `json:"sku"`
	Email  string `json:"email"`
}

// The steps of a job, in order. charge can be compensated (refund);
// reserve is the pivot: once it succeeds the job only goes forward;
// receipt is retried until it succeeds and is never compensated.
const (
	stepCharge  = "charge"
	stepReserve = "reserve"
	stepReceipt = "receipt"
	stepRefund  = "refund" // the compensation of charge
)

// Outcomes of a job's run.
const (
	outcomeCompleted   = "completed"   // charged, reserved, receipt sent
	outcomeCompensated = "compensated" // charged, out of stock, refunded
	outcomeFailed      = "failed"      // the charge itself was refused: nothing to undo
	outcomeStopped     = "stopped"     // a step's outcome is unknown or it failed unexpectedly: rerun, or ask a person
)

// Saga runs jobs of several keyed calls. Each step is one Client.Do under
// WithOperation(ctx, job+"/"+step), so its key is journaled before its
// first byte leaves and reused by every retry and rerun. With
// Policy.KeepResults, a step that is done gets its kept response back on
// a rerun, marked a replay, and nothing is sent: the rerun reuses the
// charge id the first run received, even if the process died a
// microsecond after the server answered.
//
// A Saga is safe for concurrent use by jobs with distinct IDs; two runs
// of one job at once are kept apart by the journal (one key per step) but
// their steps may interleave.
type Saga struct {
	Client   *idemhttp.Client // with a Journal and Policy.KeepResults
	Services Services
	// AfterStep, when set, is called after each step has returned: a test
	// seam for a crash between steps.
	AfterStep func(job, step string)
}

// Report is what one run of a job did.
type Report struct {
	Job     string       `json:"job"`
	Outcome string       `json:"outcome"`
	Steps   []StepReport `json:"steps"`
	Err     string       `json:"error,omitempty"`
}

// StepReport is one step of a run.
type StepReport struct {
	Step   string `json:"step"`
	Status int    `json:"status"`
	ID     string `json:"id,omitempty"` // the object the step created: ch_, rs_, rc_, re_
	// Source is "journal" when the response is the result the journal
	// kept for a step done earlier (nothing was sent), "replay" when the
	// server replayed its stored response, "sent" when it ran now.
	Source string `json:"source"`
}

// stepResult is a step's final response.
type stepResult struct {
	StepReport
	body []byte
}

// errNoResult: a step is done but its result was not kept (a body larger
// than KeepResults, or a journal written without it), so the job cannot
// go on with it. It fails closed: it stops rather than ask again under a
// new key.
var errNoResult = errors.New("the step is done, but its result was not kept")

// Run runs the job for o, or the rest of it: steps done in an earlier run
// come back from the journal and are not sent again. Run never
// compensates on an unknown outcome: a step that gave up without a
// definite answer stops the job, which a rerun resumes.
func (s *Saga) Run(ctx context.Context, o Order) Report {
	rep := Report{Job: o.ID}
	stop := func(step string, err error) Report {
		rep.Outcome, rep.Err = outcomeStopped, fmt.Sprintf("%s: %v", step, err)
		return rep
	}
	charge, err := s.step(ctx, o.ID, stepCharge, s.Services.Payments+"/v1/charges",
		map[string]any{"amount": o.Amount, "currency": "usd"}, &rep)
	switch {
	case err != nil:
		return stop(stepCharge, err)
	case charge.Status != http.StatusOK:
		rep.Outcome = outcomeFailed
		return rep
	}
	reserve, err := s.step(ctx, o.ID, stepReserve, s.Services.Inventory+"/v1/reservations",
		map[string]any{"sku": o.SKU, "quantity": 1}, &rep)
	switch {
	case err != nil:
		return stop(stepReserve, err) // unknown: perhaps reserved; never refund on a guess
	case reserve.Status == http.StatusConflict && problemType(reserve.body) == outOfStockType:
		// Failed for good, and stored so by the server: undo the charge,
		// under a key of its own, with the charge id the first step got.
		refund, err := s.step(ctx, o.ID, stepRefund, s.Services.Payments+"/v1/refunds",
			map[string]any{"charge": charge.ID}, &rep)
		switch {
		case err != nil:
			return stop(stepRefund, err)
		case refund.Status != http.StatusOK:
			return stop(stepRefund, fmt.Errorf("status %d: %s", refund.Status, refund.body))
		}
		rep.Outcome = outcomeCompensated
		return rep
	case reserve.Status != http.StatusOK:
		return stop(stepReserve, fmt.Errorf("status %d: %s", reserve.Status, reserve.body))
	}
	receipt, err := s.step(ctx, o.ID, stepReceipt, s.Services.Mailer+"/v1/receipts",
		map[string]any{"charge": charge.ID, "reservation": reserve.ID, "email": o.Email}, &rep)
	switch {
	case err != nil:
		return stop(stepReceipt, err)
	case receipt.Status != http.StatusOK:
		return stop(stepReceipt, fmt.Errorf("status %d: %s", receipt.Status, receipt.body))
	}
	rep.Outcome = outcomeCompleted
	return rep
}

// step sends one step of job as a keyed call under the operation
// job/step and appends it to rep.
func (s *Saga) step(ctx context.Context, job, step, url string, body map[string]any, rep *Report) (*stepResult, error) {
	op := job + "/" + step
	body["operation"] = op // names the effect in the services' counts
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(idemhttp.WithOperation(ctx, op), http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.Client.Do(req)
	var done *idemhttp.DoneError
	if errors.As(err, &done) {
		return nil, fmt.Errorf("%w (status %d, key %s)", errNoResult, done.Status, done.Key)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	res := &stepResult{StepReport: StepReport{Step: step, Status: resp.StatusCode, Source: "sent"}}
	if res.body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20)); err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	info, _ := idemhttp.ResponseInfo(resp)
	switch {
	case info.FromJournal:
		res.Source = "journal"
	case idemhttp.Replayed(resp):
		res.Source = "replay"
	}
	var obj struct {
		ID string `json:"id"`
	}
	if resp.StatusCode == http.StatusOK && json.Unmarshal(res.body, &obj) == nil {
		res.ID = obj.ID
	}
	rep.Steps = append(rep.Steps, res.StepReport)
	if s.AfterStep != nil {
		s.AfterStep(job, step)
	}
	return res, nil
}

// problemType returns the type of an RFC 9457 problem body, "" if it is
// not one.
func problemType(body []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Type
}
