package otel

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtrace"
	otelapi "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/idemkit/idemhttp/contrib/otel"

// Attribute keys of this package's own attributes.
const (
	KeyAttr          = attribute.Key("idemhttp.idempotency_key") // only with Options.RecordKey
	OperationAttr    = attribute.Key("idemhttp.operation")       // only with Options.RecordOperation
	AttemptsAttr     = attribute.Key("idemhttp.attempts")
	ReplayedAttr     = attribute.Key("idemhttp.replayed")
	ErrorClassAttr   = attribute.Key("idemhttp.error_class")
	RetryReasonAttr  = attribute.Key("idemhttp.retry.reason")
	RetryDelayAttr   = attribute.Key("idemhttp.retry.delay_ms")
	GiveUpReasonAttr = attribute.Key("idemhttp.give_up.reason")
	OutcomeAttr      = attribute.Key("idemhttp.outcome")
	JournalOpAttr    = attribute.Key("idemhttp.journal.op")
)

// Options configure [New] and [NewServer]. The zero value uses the global providers and
// records neither keys nor operation ids.
type Options struct {
	// TracerProvider and MeterProvider; nil means the global ones
	// (otel.GetTracerProvider, otel.GetMeterProvider).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider

	// RecordKey puts the idempotency key on the call's and the attempts'
	// spans. A key is not a credential, but it names one operation: with
	// it, anyone who reads the traces can find the operation's stored
	// response on the server. Off by default.
	RecordKey bool

	// RecordOperation puts the operation id (idemhttp.WithOperation) on
	// the call's span. Operation ids are often order or customer ids.
	// Off by default.
	RecordOperation bool

	// RecordScope puts the principal's scope (idemserver's
	// Middleware.Principal) on the server span's events, for
	// [NewServer]. A scope often names a tenant or an account. Off by
	// default. (RecordKey applies to the server's events too, and,
	// through idemserver.Hooks.RecordKey, to the log records of the
	// middleware the hooks are given to: see idemserver.KeyDigest.)
	RecordScope bool
}

// Instrumentation holds the tracer and the instruments for one Client.
// Create it with [New]; set what [Instrumentation.Hooks] returns as the
// client's Hooks before its first request.
type Instrumentation struct {
	tracer trace.Tracer
	opts   Options
	hooks  idemtrace.Hooks
	reg    metric.Registration
	jreg   metric.Registration // the journal's write and sync counters, nil if it has none

	attempts, retries, giveUps, refusals, waits, calls, journalOps metric.Int64Counter
	attemptDuration                                                metric.Float64Histogram
}

// New creates the instrumentation of c: its tracer, its instruments, and
// gauges that read c.Stats when metrics are collected. Call Close to stop
// the gauges. opts may be nil.
func New(c *idemhttp.Client, opts *Options) (*Instrumentation, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	tp, mp := o.TracerProvider, o.MeterProvider
	if tp == nil {
		tp = otelapi.GetTracerProvider()
	}
	if mp == nil {
		mp = otelapi.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	in := &Instrumentation{tracer: tp.Tracer(ScopeName), opts: o}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{"+unitOf(name)+"}"))
		errs = append(errs, err)
		return c
	}
	in.attempts = counter("idemhttp.client.attempts", "HTTP attempts sent, by method, status and error class")
	in.retries = counter("idemhttp.client.retries", "retries decided, by reason")
	in.giveUps = counter("idemhttp.client.give_ups", "calls that stopped retrying, by reason")
	in.refusals = counter("idemhttp.client.budget.refusals", "retries the retry budget refused")
	in.waits = counter("idemhttp.client.in_progress.waits", "waits for a first request with the same key that was still in progress")
	in.calls = counter("idemhttp.client.calls", "calls finished, by method and outcome")
	in.journalOps = counter("idemhttp.client.journal.operations", "journal operations, by operation and outcome")
	var err error
	in.attemptDuration, err = m.Float64Histogram("idemhttp.client.attempt.duration",
		metric.WithDescription("time from sending an attempt to its response headers or error"), metric.WithUnit("s"))
	errs = append(errs, err)
	tokens, err := m.Int64ObservableGauge("idemhttp.client.budget.tokens", metric.WithDescription("tokens left in the retry budget"), metric.WithUnit("{token}"))
	errs = append(errs, err)
	capacity, err := m.Int64ObservableGauge("idemhttp.client.budget.capacity", metric.WithDescription("size of the retry budget"), metric.WithUnit("{token}"))
	errs = append(errs, err)
	inflight, err := m.Int64ObservableGauge("idemhttp.client.in_flight", metric.WithDescription("calls in progress"), metric.WithUnit("{call}"))
	errs = append(errs, err)
	pending, err := m.Int64ObservableGauge("idemhttp.client.journal.pending", metric.WithDescription("journal entries whose outcome is unknown"), metric.WithUnit("{entry}"))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("idemhttp/contrib/otel: instruments: %w", err)
	}
	in.reg, err = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		s := c.Stats()
		obs.ObserveInt64(inflight, s.InFlight)
		if s.BudgetCapacity > 0 {
			obs.ObserveInt64(tokens, s.BudgetTokens)
			obs.ObserveInt64(capacity, s.BudgetCapacity)
		}
		if s.JournalPending >= 0 {
			obs.ObserveInt64(pending, int64(s.JournalPending))
		}
		return nil
	}, tokens, capacity, inflight, pending)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/contrib/otel: gauges: %w", err)
	}
	if js, ok := c.Journal.(journalStats); ok {
		if in.jreg, err = registerJournalStats(m, js); err != nil {
			_ = in.reg.Unregister()
			return nil, err
		}
	}
	in.hooks = idemtrace.Hooks{
		OnCallStart:     in.callStart,
		OnAttempt:       in.attempt,
		OnAttemptDone:   in.attemptDone,
		OnRetry:         in.retry,
		OnBudgetRefused: in.budgetRefused,
		OnGiveUp:        in.giveUp,
		OnCallDone:      in.callDone,
		OnJournal:       in.journal,
	}
	return in, nil
}

func unitOf(name string) string {
	switch name {
	case "idemhttp.client.attempts":
		return "attempt"
	case "idemhttp.client.retries":
		return "retry"
	case "idemhttp.client.give_ups", "idemhttp.client.calls":
		return "call"
	case "idemhttp.client.budget.refusals":
		return "refusal"
	case "idemhttp.client.in_progress.waits":
		return "wait"
	}
	return "operation"
}

// Hooks returns the hooks to set as the client's [idemhttp.Client.Hooks].
// Each call returns a new copy, which the caller may extend.
func (in *Instrumentation) Hooks() *idemtrace.Hooks {
	h := in.hooks
	return &h
}

// Close stops the gauges' callback. The counters and spans stop when the
// client stops calling the hooks.
func (in *Instrumentation) Close() error {
	err := in.reg.Unregister()
	if in.jreg != nil {
		err = errors.Join(err, in.jreg.Unregister())
	}
	return err
}

// journalStats is what a journal that counts its writes offers
// ([filejournal.Journal]).
type journalStats interface {
	Stats() filejournal.Stats
}

// registerJournalStats exports a journal's record writes and its syncs
// (group commits): syncs per write is what group commit saves, and a
// dashboard's first question about journal cost.
func registerJournalStats(m metric.Meter, js journalStats) (metric.Registration, error) {
	writes, err1 := m.Int64ObservableCounter("idemhttp.client.journal.writes",
		metric.WithDescription("records the journal appended: one per Begin that stored an entry, per Finish and per deleted entry"), metric.WithUnit("{record}"))
	syncs, err2 := m.Int64ObservableCounter("idemhttp.client.journal.syncs",
		metric.WithDescription("synchronous writes (group commits) the journal made"), metric.WithUnit("{sync}"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("idemhttp/contrib/otel: journal counters: %w", err)
	}
	reg, err := m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
		s := js.Stats()
		obs.ObserveInt64(writes, int64(s.Writes))
		obs.ObserveInt64(syncs, int64(s.Commits))
		return nil
	}, writes, syncs)
	if err != nil {
		return nil, fmt.Errorf("idemhttp/contrib/otel: journal counters: %w", err)
	}
	return reg, nil
}

// call is one call's tracing state, carried in its context.
type call struct {
	span    trace.Span
	method  attribute.KeyValue
	server  []attribute.KeyValue // server.address, server.port
	attempt trace.Span           // the current attempt's span, until it ends
	end     time.Time            // when the current attempt's response (or error) arrived
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

func (in *Instrumentation) callStart(ctx context.Context, ev idemtrace.CallEvent) context.Context {
	c := &call{method: semconv.HTTPRequestMethodKey.String(ev.Method)}
	if u, err := url.Parse(ev.URL); err == nil {
		c.server = append(c.server, semconv.ServerAddress(u.Hostname()))
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err == nil {
				c.server = append(c.server, semconv.ServerPort(n))
			}
		}
	}
	attrs := []attribute.KeyValue{c.method, semconv.URLFull(ev.URL)}
	attrs = append(attrs, c.server...)
	if in.opts.RecordKey && ev.Key != "" {
		attrs = append(attrs, KeyAttr.String(ev.Key))
	}
	if in.opts.RecordOperation && ev.Operation != "" {
		attrs = append(attrs, OperationAttr.String(ev.Operation))
	}
	ctx, c.span = in.tracer.Start(ctx, "idemhttp "+ev.Method, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, callKey{}, c)
}

func (in *Instrumentation) attempt(ctx context.Context, ev idemtrace.AttemptEvent) {
	c := callFrom(ctx)
	if c == nil {
		return
	}
	c.endAttempt()
	attrs := []attribute.KeyValue{c.method, semconv.URLFull(ev.URL)}
	attrs = append(attrs, c.server...)
	if ev.Attempt > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCount(ev.Attempt-1))
	}
	if in.opts.RecordKey && ev.Key != "" {
		attrs = append(attrs, KeyAttr.String(ev.Key))
	}
	// The attempt is the HTTP client span; its name is the method, as
	// the conventions ask.
	_, c.attempt = in.tracer.Start(ctx, ev.Method, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endAttempt ends the current attempt's span, at the time its outcome
// arrived: the span stays open until the decision about it is known, so
// that it can carry the retry's reason.
func (c *call) endAttempt() {
	if c.attempt == nil {
		return
	}
	if c.end.IsZero() {
		c.attempt.End()
	} else {
		c.attempt.End(trace.WithTimestamp(c.end))
	}
	c.attempt, c.end = nil, time.Time{}
}

func (in *Instrumentation) attemptDone(ctx context.Context, ev idemtrace.AttemptDoneEvent) {
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(ev.Method)}
	var errType string
	switch {
	case ev.Err != nil:
		errType = string(ev.Class)
		attrs = append(attrs, ErrorClassAttr.String(string(ev.Class)))
	case ev.Status >= 400:
		errType = strconv.Itoa(ev.Status)
	}
	if ev.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(ev.Status))
	}
	if errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
	}
	set := metric.WithAttributes(attrs...)
	in.attempts.Add(ctx, 1, set)
	in.attemptDuration.Record(ctx, ev.Latency.Seconds(), set)

	c := callFrom(ctx)
	if c == nil || c.attempt == nil {
		return
	}
	c.end = time.Now()
	if ev.Status != 0 {
		c.attempt.SetAttributes(semconv.HTTPResponseStatusCode(ev.Status))
	}
	if errType != "" {
		c.attempt.SetAttributes(semconv.ErrorTypeKey.String(errType))
		c.attempt.SetStatus(codes.Error, errType)
	}
	if ev.Err != nil {
		c.attempt.SetAttributes(ErrorClassAttr.String(string(ev.Class)))
		in.recordError(c.attempt, ev.Err, ev.Key)
	}
}

func (in *Instrumentation) retry(ctx context.Context, ev idemtrace.RetryEvent) {
	reason := RetryReasonAttr.String(string(ev.Reason))
	in.retries.Add(ctx, 1, metric.WithAttributes(reason))
	if ev.Reason == idemtrace.ReasonInProgress {
		in.waits.Add(ctx, 1)
	}
	c := callFrom(ctx)
	if c == nil || c.attempt == nil {
		return
	}
	c.attempt.SetAttributes(reason, RetryDelayAttr.Int64(ev.Delay.Milliseconds()))
	c.endAttempt()
}

func (in *Instrumentation) budgetRefused(ctx context.Context, ev idemtrace.BudgetEvent) {
	in.refusals.Add(ctx, 1)
	if c := callFrom(ctx); c != nil {
		c.span.AddEvent("retry budget refused", trace.WithAttributes(
			attribute.Int64("idemhttp.budget.tokens", ev.Tokens), attribute.Int64("idemhttp.budget.cost", ev.Cost)))
	}
}

func (in *Instrumentation) giveUp(ctx context.Context, ev idemtrace.GiveUpEvent) {
	cause := ev.Err
	if g := (*idemhttp.GiveUpError)(nil); errors.As(ev.Err, &g) {
		cause = g.Reason
	}
	reason := GiveUpReasonAttr.String(GiveUpReason(cause))
	in.giveUps.Add(ctx, 1, metric.WithAttributes(reason))
	if c := callFrom(ctx); c != nil {
		c.span.SetAttributes(reason)
	}
}

func (in *Instrumentation) callDone(ctx context.Context, ev idemtrace.CallDoneEvent) {
	outcome := "response"
	if ev.Err != nil {
		outcome = "error"
	}
	in.calls.Add(ctx, 1, metric.WithAttributes(semconv.HTTPRequestMethodKey.String(ev.Method), OutcomeAttr.String(outcome), ReplayedAttr.Bool(ev.Replayed)))
	c := callFrom(ctx)
	if c == nil {
		return
	}
	c.endAttempt()
	c.span.SetAttributes(AttemptsAttr.Int(ev.Attempts), ReplayedAttr.Bool(ev.Replayed))
	if ev.Status != 0 {
		c.span.SetAttributes(semconv.HTTPResponseStatusCode(ev.Status))
	}
	if ev.Err != nil {
		in.recordError(c.span, ev.Err, ev.Key)
		c.span.SetStatus(codes.Error, "call failed")
	}
	c.span.End()
}

func (in *Instrumentation) journal(ctx context.Context, ev idemtrace.JournalEvent) {
	outcome := "ok"
	if ev.Err != nil {
		outcome = "error"
	}
	in.journalOps.Add(ctx, 1, metric.WithAttributes(JournalOpAttr.String(string(ev.Op)), OutcomeAttr.String(outcome)))
}

// GiveUpReason names a [idemhttp.GiveUpError]'s Reason for a metric
// attribute: exhausted, in_progress, budget_exhausted,
// retry_after_too_long, key_required, body_changed, not_replayable,
// deadline, canceled, or other.
func GiveUpReason(reason error) string {
	switch {
	case errors.Is(reason, idemhttp.ErrBudgetExhausted):
		return "budget_exhausted"
	case errors.Is(reason, idemhttp.ErrInProgress):
		return "in_progress"
	case errors.Is(reason, idemhttp.ErrRetryAfterTooLong):
		return "retry_after_too_long"
	case errors.Is(reason, idemhttp.ErrExhausted):
		return "exhausted"
	case errors.Is(reason, idemhttp.ErrKeyRequired):
		return "key_required"
	case errors.Is(reason, idemhttp.ErrBodyChanged):
		return "body_changed"
	case errors.Is(reason, idemhttp.ErrNotReplayable):
		return "not_replayable"
	case errors.Is(reason, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(reason, context.Canceled):
		return "canceled"
	}
	return "other"
}

// recordError records err on sp as RecordError does (an exception event
// with its type and message), but without RecordKey the message names
// the idempotency key by its digest (idemhttp.KeyDigest): the client's
// errors name their key ("gave up after 2 attempts (key ...)"), and the
// key is kept off spans unless RecordKey.
func (in *Instrumentation) recordError(sp trace.Span, err error, key string) {
	msg := err.Error()
	if in.opts.RecordKey || key == "" || !strings.Contains(msg, key) {
		sp.RecordError(err)
		return
	}
	msg = strings.ReplaceAll(msg, key, "key_digest:"+idemhttp.KeyDigest(key))
	sp.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(semconv.ExceptionType(typeName(err)), semconv.ExceptionMessage(msg)))
}

// typeName names err's type as the SDK's RecordError does.
func typeName(err error) string {
	t := reflect.TypeOf(err)
	if t.PkgPath() == "" && t.Name() == "" {
		return t.String()
	}
	return t.PkgPath() + "." + t.Name()
}
