package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/idemkit/idemhttp/inbox"
)

// Settings are the settings of the consumer a scenario of [RunAdapter]
// runs: each adapter maps them onto its own (Consumer.Retry, Ledger,
// ProcessingLimit, its prefetch or batch, OnDeadLetter).
type Settings struct {
	// Retry is the consumer's Retry.
	Retry inbox.Retry
	// Ledger is the consumer's Ledger, shared by the scenario's Runs.
	Ledger inbox.Ledger
	// ProcessingLimit is the consumer's; zero means the adapter's
	// default.
	ProcessingLimit time.Duration
	// Prefetch is how many deliveries the consumer takes ahead of the
	// handler (a QoS prefetch, a pull's batch); zero means the adapter's
	// default.
	Prefetch int
	// OnDeadLetter must be called for every message the adapter gives
	// up on, once its dead letter is done.
	OnDeadLetter func(inbox.DeadLetter)
	// DeadLetterFault, when set, is called before each dead letter the
	// consumer attempts; an error it returns is that dead letter's
	// failure, as its broker's would be (a failed produce, a reject on a
	// channel that closed). Adapters that cannot inject it say so in
	// [Adapter.Unsupported] for [ScenarioDeadLetterFails].
	DeadLetterFault func() error
}

// Adapter is a broker adapter under [RunAdapter]'s scenarios, on a queue
// (stream, topic) of its own, whose dead-letter destination exists.
type Adapter interface {
	// Publish publishes one message per id, in order, with the id where
	// the adapter reads it.
	Publish(t *testing.T, ids ...string)
	// Run runs a consumer with s on h until ctx ends (or it fails), and
	// returns its error. Several Runs may be under way at once.
	Run(ctx context.Context, s Settings, h inbox.Handler) error
	// Unsupported returns why the adapter cannot run the scenario named
	// scenario, or "" when it can. Kafka does not release a message at
	// the processing limit (its partition stays with its member: the
	// limit is a failure like any other); SQS dead-letters by its own
	// receive count (its redrive policy), which shutdowns raise.
	Unsupported(scenario string) string
}

// Outcome is what a scenario saw: per message id, the handler's calls and
// successes, and the ids given up on.
type Outcome struct {
	// Calls counts the handler's calls per message id.
	Calls map[string]int
	// Successes counts the calls that returned nil per message id.
	Successes map[string]int
	// Dead lists, sorted, the ids reported to OnDeadLetter.
	Dead []string
}

// scenarioHandler counts and behaves per id.
type scenarioHandler struct {
	mu        sync.Mutex
	calls     map[string]int
	successes map[string]int
	dead      []string
	changed   chan struct{}
	behave    func(ctx context.Context, id string, call int) error
}

func newScenarioHandler(behave func(ctx context.Context, id string, call int) error) *scenarioHandler {
	return &scenarioHandler{calls: map[string]int{}, successes: map[string]int{}, changed: make(chan struct{}, 1), behave: behave}
}

func (h *scenarioHandler) poke() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

func (h *scenarioHandler) handle(ctx context.Context, m *inbox.Message) error {
	h.mu.Lock()
	h.calls[m.ID]++
	n := h.calls[m.ID]
	h.mu.Unlock()
	h.poke()
	err := h.behave(ctx, m.ID, n)
	if err == nil {
		h.mu.Lock()
		h.successes[m.ID]++
		h.mu.Unlock()
		h.poke()
	}
	return err
}

func (h *scenarioHandler) onDead(d inbox.DeadLetter) {
	h.mu.Lock()
	h.dead = append(h.dead, d.Message.ID)
	h.mu.Unlock()
	h.poke()
}

func (h *scenarioHandler) outcome() Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	dead := slices.Clone(h.dead)
	sort.Strings(dead)
	o := Outcome{Calls: map[string]int{}, Successes: map[string]int{}, Dead: dead}
	for k, v := range h.calls {
		o.Calls[k] = v
	}
	for k, v := range h.successes {
		o.Successes[k] = v
	}
	return o
}

// waitFor waits until cond holds on h's outcome, or 30 s pass.
func (h *scenarioHandler) waitFor(t *testing.T, what string, cond func(Outcome) bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for !cond(h.outcome()) {
		select {
		case <-h.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("%s: not in 30 s; so far %+v", what, h.outcome())
		}
	}
}

// runUntil runs a on h until cond holds, then stops it.
func runUntil(t *testing.T, a Adapter, s Settings, h *scenarioHandler, what string, cond func(Outcome) bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx, s, h.handle) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Run: %v", what, err)
		}
	}()
	h.waitFor(t, what, cond)
}

// scenario is one of RunAdapter's, run on a fresh adapter.
type scenario struct {
	name string
	run  func(t *testing.T, a Adapter) Outcome
}

// The names of RunAdapter's scenarios, for [Adapter.Unsupported].
const (
	ScenarioPoison    = "PoisonBesideHealthy"
	ScenarioShutdowns = "ShutdownsNeverCount"
	ScenarioHung      = "HungNeighbourDoesNotDrag"
	// ScenarioDeadLetterFails: the first dead letter fails.
	ScenarioDeadLetterFails = "DeadLetterFailureKeepsTheCount"
)

var scenarios = []scenario{
	{name: ScenarioPoison, run: poisonBesideHealthy},
	{name: ScenarioShutdowns, run: shutdownsNeverCount},
	{name: ScenarioHung, run: hungNeighbour},
	{name: ScenarioDeadLetterFails, run: deadLetterFails},
}

// RunAdapter pins a broker adapter to the model: each scenario runs on
// the [ModelAdapter] (the message core on the modelled broker) and on the
// adapter newAdapter returns (a new queue each time), and both must give
// the same outcome. Each adapter's tests run it on its real broker.
func RunAdapter(t *testing.T, newAdapter func(t *testing.T) Adapter) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			real := newAdapter(t)
			if why := real.Unsupported(sc.name); why != "" {
				t.Skip(why)
			}
			want := sc.run(t, NewModelAdapter())
			t.Logf("the model: %+v", want)
			got := sc.run(t, real)
			assert.Equal(t, want, got, "the adapter's outcome is the model's")
		})
	}
}

// A poison message beside a healthy one: the poison one runs exactly
// MaxDeliveries times and is dead-lettered; the healthy one runs once.
func poisonBesideHealthy(t *testing.T, a Adapter) Outcome {
	h := newScenarioHandler(func(_ context.Context, id string, _ int) error {
		if id == "poison" {
			return errors.New("cannot parse")
		}
		return nil
	})
	a.Publish(t, "poison", "healthy")
	s := Settings{Retry: inbox.Retry{Delay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, MaxDeliveries: 3},
		Ledger: &inbox.MemoryLedger{}, OnDeadLetter: h.onDead}
	runUntil(t, a, s, h, "poison dead-lettered, healthy done", func(o Outcome) bool {
		return len(o.Dead) == 1 && o.Successes["healthy"] == 1
	})
	return h.outcome()
}

// A poison message whose first dead letter fails, beside a healthy one:
// the poison one runs exactly MaxDeliveries times, its count kept through
// the failed dead letter, so that its redelivery is dead-lettered on
// arrival, unrun; it is reported once, when its dead letter is done.
// Checked to fail (on the model and on Kafka) with the core forgetting
// the record before the dead letter: the poison ran six times.
func deadLetterFails(t *testing.T, a Adapter) Outcome {
	h := newScenarioHandler(func(_ context.Context, id string, _ int) error {
		if id == "poison" {
			return errors.New("cannot parse")
		}
		return nil
	})
	a.Publish(t, "poison", "healthy")
	var mu sync.Mutex
	attempts := 0
	s := Settings{Retry: inbox.Retry{Delay: 20 * time.Millisecond, MaxDelay: 100 * time.Millisecond, MaxDeliveries: 3},
		Ledger: &inbox.MemoryLedger{}, OnDeadLetter: h.onDead,
		DeadLetterFault: func() error {
			mu.Lock()
			defer mu.Unlock()
			attempts++
			if attempts == 1 {
				return errors.New("the dead-letter destination is down, once")
			}
			return nil
		}}
	runUntil(t, a, s, h, "poison dead-lettered at its second attempt, healthy done", func(o Outcome) bool {
		return len(o.Dead) == 1 && o.Successes["healthy"] == 1
	})
	mu.Lock()
	n := attempts
	mu.Unlock()
	assert.Equal(t, 2, n, "dead letters attempted")
	o := h.outcome()
	assert.Equal(t, 3, o.Calls["poison"], "the poison ran MaxDeliveries times, not again after its dead letter failed")
	return o
}

// A healthy message whose handler three shutdowns interrupt, with
// MaxDeliveries 2: none counts, and it then runs and succeeds.
func shutdownsNeverCount(t *testing.T, a Adapter) Outcome {
	stop := true
	var mu sync.Mutex
	h := newScenarioHandler(func(ctx context.Context, _ string, _ int) error {
		mu.Lock()
		s := stop
		mu.Unlock()
		if s {
			<-ctx.Done() // until the shutdown
			return ctx.Err()
		}
		return nil
	})
	a.Publish(t, "healthy")
	s := Settings{Retry: inbox.Retry{Delay: 20 * time.Millisecond, MaxDeliveries: 2}, Ledger: &inbox.MemoryLedger{}, OnDeadLetter: h.onDead}
	for i := 1; i <= 3; i++ {
		runUntil(t, a, s, h, fmt.Sprintf("shutdown %d", i), func(o Outcome) bool { return o.Calls["healthy"] == i })
	}
	mu.Lock()
	stop = false
	mu.Unlock()
	runUntil(t, a, s, h, "runs after the shutdowns", func(o Outcome) bool { return o.Successes["healthy"] == 1 || len(o.Dead) > 0 })
	return h.outcome()
}

// A handler that hangs past its processing limit, with a healthy message
// taken ahead behind it: the hung one is counted (MaxDeliveries 1) and
// dead-lettered on its next arrival, unrun; the healthy one runs once,
// on the other consumer.
func hungNeighbour(t *testing.T, a Adapter) Outcome {
	unblock := make(chan struct{})
	h := newScenarioHandler(func(_ context.Context, id string, _ int) error {
		if id == "hung" {
			<-unblock // ignores its context
		}
		return nil
	})
	a.Publish(t, "hung", "healthy")
	s := Settings{Retry: inbox.Retry{Delay: 20 * time.Millisecond, MaxDeliveries: 1}, Ledger: &inbox.MemoryLedger{},
		ProcessingLimit: 200 * time.Millisecond, Prefetch: 2, OnDeadLetter: h.onDead}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx, s, h.handle) }()
	h.waitFor(t, "the hung handler runs", func(o Outcome) bool { return o.Calls["hung"] == 1 })
	// A second consumer takes what the first releases.
	runUntil(t, a, s, h, "hung dead-lettered, healthy done", func(o Outcome) bool {
		return len(o.Dead) == 1 && o.Successes["healthy"] == 1
	})
	close(unblock)
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("the hung consumer's Run: %v", err)
	}
	o := h.outcome()
	delete(o.Successes, "hung") // its late return settles nothing, on any adapter
	return o
}

// ModelAdapter is the [Adapter] of the model: the message core
// ([inbox.Runner]) on a [Broker], mapping each decision onto the broker's
// verbs as a real adapter does, with the broker's time moved on whenever
// no message is due. [RunAdapter] pins the real adapters to it.
type ModelAdapter struct {
	Broker *Broker
	mu     sync.Mutex
	runs   int
}

// NewModelAdapter returns a model adapter on a new broker.
func NewModelAdapter() *ModelAdapter { return &ModelAdapter{Broker: NewBroker(0)} }

// Publish implements [Adapter].
func (a *ModelAdapter) Publish(_ *testing.T, ids ...string) {
	for _, id := range ids {
		a.Broker.Publish(id)
	}
}

// Unsupported implements [Adapter]: the model runs every scenario.
func (a *ModelAdapter) Unsupported(string) string { return "" }

// Run implements [Adapter].
func (a *ModelAdapter) Run(ctx context.Context, s Settings, h inbox.Handler) error {
	a.mu.Lock()
	a.runs++
	name := fmt.Sprintf("run-%d", a.runs)
	a.mu.Unlock()
	prefetch := max(s.Prefetch, 1)
	r := &inbox.Runner{Policy: inbox.Policy{Retry: s.Retry}, Ledger: s.Ledger, Handler: h, Limit: s.ProcessingLimit}
	var held []BrokerDelivery
	var heldMu sync.Mutex
	deliver := func(bd BrokerDelivery, release func()) error {
		m := &inbox.Message{ID: bd.ID, IDSpace: "model", Redelivered: bd.Redelivered()}
		arrival := inbox.Arrival{HasID: bd.ID != "", Stopping: ctx.Err() != nil, MaybeRedelivered: bd.Redelivered()}
		dec, d := r.Deliver(ctx, m, inbox.Key{IDSpace: m.IDSpace, ID: m.ID}, arrival, inbox.Hooks{Release: release})
		switch dec.Verb {
		case inbox.VerbAck:
			return a.Broker.Ack(bd.Tag)
		case inbox.VerbRequeue:
			return a.Broker.Requeue(bd.Tag, dec.Delay)
		case inbox.VerbDeadLetter:
			var err error
			if s.DeadLetterFault != nil {
				err = s.DeadLetterFault()
			}
			if err == nil {
				err = a.Broker.DeadLetter(bd.Tag)
			}
			after := r.DeadLettered(ctx, d, inbox.Key{IDSpace: m.IDSpace, ID: m.ID}, err)
			if err != nil {
				// Kept with its count: back after the core's delay, to be
				// dead-lettered on arrival.
				_ = a.Broker.Requeue(bd.Tag, after.Delay)
				return nil
			}
			if s.OnDeadLetter != nil {
				s.OnDeadLetter(inbox.DeadLetter{Message: m, Deliveries: dec.Failures, Err: dec.Err, To: "the model's dead letters"})
			}
			return nil
		case inbox.VerbStop:
			_ = a.Broker.Requeue(bd.Tag, 0)
			return dec.Err
		}
		if d.State() != inbox.StateReleased {
			_ = a.Broker.Requeue(bd.Tag, 0)
			return dec.Err
		}
		return nil
	}
	for {
		if ctx.Err() != nil {
			heldMu.Lock()
			rest := held
			held = nil
			heldMu.Unlock()
			for _, bd := range rest {
				_ = deliver(bd, nil) // handed back, unrun
			}
			return ctx.Err()
		}
		heldMu.Lock()
		for len(held) < prefetch {
			bd, ok := a.Broker.Deliver(name, prefetch)
			if !ok {
				break
			}
			held = append(held, bd)
		}
		if len(held) == 0 {
			heldMu.Unlock()
			if d, ok := a.Broker.NextDue(); ok {
				a.Broker.Advance(d)
				continue
			}
			t := time.NewTimer(time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		bd := held[0]
		held = held[1:]
		heldMu.Unlock()
		err := deliver(bd, func() {
			// At the limit: this delivery and those taken ahead go back,
			// to other consumers; the ones taken ahead are not counted.
			_ = a.Broker.Requeue(bd.Tag, 0)
			heldMu.Lock()
			rest := held
			held = nil
			heldMu.Unlock()
			for _, other := range rest {
				_ = a.Broker.Requeue(other.Tag, 0)
			}
		})
		if err != nil && !errors.Is(err, ErrStaleTag) {
			return err
		}
	}
}

var _ Adapter = (*ModelAdapter)(nil)
