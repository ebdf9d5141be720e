package inbox

import (
	"context"
	"log/slog"
	"time"
)

// Defaults of the zero fields of [Retry].
const (
	// DefaultRetryDelay is the delay before a message whose handler failed
	// is delivered again, the first time.
	DefaultRetryDelay = time.Second
	// DefaultMaxRetryDelay caps the growing delay.
	DefaultMaxRetryDelay = 5 * time.Minute
	// DefaultMaxDeliveries is how many deliveries a message whose handler
	// always fails gets before it is dead-lettered: the first and four
	// redeliveries, 1+2+4+8 = 15 s of delays with the default delay.
	DefaultMaxDeliveries = 5
)

// DefaultProcessingLimit is how long the broker adapters let a handler
// run by default before they end its context and hand its message back
// for redelivery: far longer than any handler should take, and far
// shorter than for ever. A handler that may run longer needs a longer
// limit (each adapter's ProcessingLimit).
const DefaultProcessingLimit = 5 * time.Minute

// Retry is how a broker adapter redelivers a message whose handler
// failed (a poison message, or one that met an outage): after a delay
// that doubles with each delivery, a bounded number of times, and then to
// the broker's dead-letter destination. It never redelivers at once, so
// a handler that always fails cannot spin through the queue.
//
// The zero value is the default: 1 s, doubling up to 5 min, 5 deliveries.
// A Retry is a value; it is safe to share.
type Retry struct {
	// Delay is the wait before the second delivery; each later one waits
	// twice as long as the one before. Zero means [DefaultRetryDelay];
	// negative values are taken as zero.
	Delay time.Duration
	// MaxDelay caps the wait. Zero means [DefaultMaxRetryDelay].
	MaxDelay time.Duration
	// MaxDeliveries is how many times a message is delivered, the first
	// time included, before its handler's failure dead-letters it. Zero
	// means [DefaultMaxDeliveries]; negative means no limit: the message
	// comes back, at MaxDelay, until its handler succeeds, and each
	// failure past [DefaultMaxDeliveries] is reported as a message that
	// holds up its queue.
	MaxDeliveries int
}

// After returns the wait before the next delivery of a message whose
// deliveries-th delivery failed (1 for the first delivery): Delay,
// doubled for each delivery after the first, capped by MaxDelay.
func (r Retry) After(deliveries int) time.Duration {
	d, maxD := r.Delay, r.MaxDelay
	if d <= 0 {
		d = DefaultRetryDelay
	}
	if maxD <= 0 {
		maxD = DefaultMaxRetryDelay
	}
	for i := 1; i < deliveries && d < maxD; i++ {
		if d > maxD/2 {
			return maxD // doubling would pass the cap, or overflow
		}
		d *= 2
	}
	return min(d, maxD)
}

// Limit returns how many deliveries a message gets, and false when there
// is no limit.
func (r Retry) Limit() (int, bool) {
	switch {
	case r.MaxDeliveries == 0:
		return DefaultMaxDeliveries, true
	case r.MaxDeliveries < 0:
		return 0, false
	}
	return r.MaxDeliveries, true
}

// Exhausted reports whether a message whose deliveries-th delivery failed
// is to be dead-lettered rather than delivered again.
func (r Retry) Exhausted(deliveries int) bool {
	n, ok := r.Limit()
	return ok && deliveries >= n
}

// DeadLetter describes a message an adapter gave up on: one whose handler
// failed on its last allowed delivery, or that has no id. The adapter
// hands it to the broker's dead-letter mechanism and reports it with
// [ReportDeadLetter].
type DeadLetter struct {
	// Message is the message. It is valid only during the report.
	Message *Message
	// Deliveries is how many times the message was delivered, as far as
	// the adapter knows (0 when it cannot tell).
	Deliveries int
	// Err says why: the last handler error, or [ErrNoMessageID].
	Err error
	// To says what became of the message: the broker's dead-letter
	// destination, or that it stays where it is and holds up its queue.
	To string
}

// ReportDeadLetter logs d as one line at level Error on logger
// ([slog.Default] when nil), with the message's source, id, id space and
// deliveries (never its body or headers), and then calls hook with d
// when hook is not nil. Adapters call it from the goroutine of their Run.
func ReportDeadLetter(logger *slog.Logger, hook func(DeadLetter), d DeadLetter) {
	if logger == nil {
		logger = slog.Default()
	}
	attrs := []slog.Attr{slog.String("to", d.To), slog.Int("deliveries", d.Deliveries)}
	if m := d.Message; m != nil {
		attrs = append(attrs, slog.String("source", m.Source), slog.String("id", m.ID))
		if m.IDSpace != "" {
			attrs = append(attrs, slog.String("id_space", m.IDSpace))
		}
	}
	if d.Err != nil {
		attrs = append(attrs, slog.String("error", d.Err.Error()))
	}
	logger.LogAttrs(context.Background(), slog.LevelError, "inbox: giving up on a message", attrs...)
	if hook != nil {
		hook(d)
	}
}
