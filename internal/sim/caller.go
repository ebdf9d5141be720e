//go:build go1.26

package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtrace"
)

// The caller's configuration (issue 32 §1.1): what a program around the
// client chooses, drawn per seed as the faults are. Its callbacks
// (PrepareRequest, every hook, the Pacer) may panic or block; its
// http.Client may carry a CheckRedirect and a Transport that wraps
// net/http's or is a protocol registered with it; two Clients may share
// one journal.

// The caller's CheckRedirect (Config.CheckRedirect).
const (
	redirectDefault   = iota // none: net/http's ten redirects, within the client's rules
	redirectLast             // http.ErrUseLastResponse: the 3xx comes back, unfollowed
	redirectRefuse           // an error of the caller's: the call fails with it
	numRedirectPolicy        // how many there are
)

// errRedirectRefused is the caller's CheckRedirect refusing a redirect.
var errRedirectRefused = errors.New("sim: the caller's CheckRedirect refuses redirects")

func checkRedirect(policy int) func(*http.Request, []*http.Request) error {
	switch policy {
	case redirectLast:
		return func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	case redirectRefuse:
		return func(*http.Request, []*http.Request) error { return errRedirectRefused }
	}
	return nil
}

// The caller's Transport (Config.Transport).
const (
	transportNetHTTP  = iota // net/http's *http.Transport: the client sees its httptrace events
	transportWrapped         // a RoundTripper wrapping it (a logging or metrics wrapper) that hides the events
	transportProtocol        // a protocol registered with Transport.RegisterProtocol: its requests go through a RoundTripper of the caller's, which net/http does not trace
	numTransports
)

// protocolScheme is the registered protocol's URL scheme.
const protocolScheme = "sim"

// hideTrace sends r with a context that has none of its values (an
// httptrace.ClientTrace among them) but ends when r's does: what a
// RoundTripper that is not net/http's shows the client of its sending.
func hideTrace(rt http.RoundTripper, r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(r.Context(), cancel)
	resp, err := rt.RoundTrip(r.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, stop: stop, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	stop   func() bool
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.stop()
	c.cancel()
	return err
}

// wrappedRT is a caller's RoundTripper around net/http's.
type wrappedRT struct{ rt http.RoundTripper }

func (t wrappedRT) RoundTrip(r *http.Request) (*http.Response, error) { return hideTrace(t.rt, r) }

// protocolRT serves the registered scheme: it sends over net/http's
// Transport as http, without its trace.
type protocolRT struct{ rt http.RoundTripper }

func (t protocolRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r2 := r.Clone(r.Context())
	u := *r.URL
	u.Scheme = "http"
	r2.URL = &u
	resp, err := hideTrace(t.rt, r2)
	if resp != nil {
		resp.Request = r
	}
	return resp, err
}

// scheme is the scheme the batch job's URLs use.
func (w *world) scheme() string {
	if w.cfg.Transport == transportProtocol {
		return protocolScheme
	}
	return "http"
}

// simPanic is what a callback the seed made panic panics with: the batch
// job's goroutine recovers it (a real job's worker might, or die).
type simPanic struct{ where string }

func (p simPanic) String() string { return "sim: " + p.where + " panics" }

// draw is a number in [0, n) drawn from the seed and parts: the same on
// every run, whatever order goroutines ask in (callbacks run on the
// client's goroutines, several at one virtual instant).
func (w *world) draw(n int, parts ...any) int {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], w.seed)
	h.Write(b[:])
	fmt.Fprint(h, parts...)
	return int(h.Sum64() % uint64(n))
}

// callback is a callback of the caller's being called for the call in
// ctx: as the seed says, it panics (a batch call's goroutine recovers
// it; on one of Resume's, Resume stops its resends and panics again in
// its caller's goroutine, which recovers it) or blocks a while (virtual
// time).
func (w *world) callback(ctx context.Context, where string) {
	c, _ := ctx.Value(callKey{}).(*call)
	if c == nil || c.p.dead.Load() || !w.faulty.Load() {
		return // after the faulty phase, as every fault, none
	}
	n := c.count(where)
	if w.draw(1000, "panic", c.id, where, n) < w.cfg.Panic {
		c.note("%s panics", where)
		w.count("callback panics")
		c.mu.Lock()
		opened := c.opened
		c.mu.Unlock()
		if strings.HasPrefix(where, "OnJournal") && !opened {
			// During the call's opening (its Begin, or judge's marking an
			// entry past the retention abandoned), before its cleanup is
			// set up: bugPanicSlot.
			w.mu.Lock()
			w.panickedOpening = true
			w.mu.Unlock()
		}
		panic(simPanic{where})
	}
	if w.draw(1000, "block", c.id, where, n) < w.cfg.Block {
		// Whole seconds would end the block at the instant the call's
		// own timers of whole seconds fire (its attempt's timeout:
		// 10 s), and which of the two goroutines runs first would be the
		// scheduler's: a block ends a few microseconds off every
		// millisecond, where nothing else of the world fires.
		d := time.Duration(1+w.draw(90, "block for", c.id, where, n))*time.Second + time.Duration(1+w.draw(997, "block off", c.id, where, n))*time.Microsecond
		c.note("%s blocks %v", where, d)
		w.count("callback blocks")
		time.Sleep(d)
	}
}

// hooks are the callbacks the job sets on its Clients.
func (w *world) hooks(p *clientProc) *idemtrace.Hooks {
	return &idemtrace.Hooks{
		OnCallStart: func(ctx context.Context, _ idemtrace.CallEvent) context.Context {
			if c, ok := ctx.Value(callKey{}).(*call); ok {
				c.mu.Lock()
				c.opened = true // the key chosen, the entry written: the call's cleanup is set up
				c.mu.Unlock()
			}
			w.callback(ctx, "OnCallStart")
			return nil
		},
		OnAttempt: func(ctx context.Context, ev idemtrace.AttemptEvent) {
			if c, ok := ctx.Value(callKey{}).(*call); ok {
				c.attempted(ev.Key)
				c.mu.Lock()
				c.tries++
				c.mu.Unlock()
			}
			w.callback(ctx, "OnAttempt")
		},
		OnAttemptDone: func(ctx context.Context, _ idemtrace.AttemptDoneEvent) { w.callback(ctx, "OnAttemptDone") },
		OnRetry:       func(ctx context.Context, _ idemtrace.RetryEvent) { w.callback(ctx, "OnRetry") },
		OnGiveUp:      func(ctx context.Context, _ idemtrace.GiveUpEvent) { w.callback(ctx, "OnGiveUp") },
		OnCallDone:    func(ctx context.Context, _ idemtrace.CallDoneEvent) { w.callback(ctx, "OnCallDone") },
		OnJournal: func(ctx context.Context, ev idemtrace.JournalEvent) {
			if ev.Err != nil && !errors.Is(ev.Err, idemhttp.ErrFenced) && !errors.Is(ev.Err, errDBLost) {
				p.jerr.Store(true)
			}
			w.callback(ctx, "OnJournal "+string(ev.Op))
		},
	}
}

// prepare is the job's PrepareRequest: it adds a credential.
func (w *world) prepare(r *http.Request) error {
	w.callback(r.Context(), "PrepareRequest")
	r.Header.Set("X-Prepared-Secret", secretPrepared)
	return nil
}

// errPaceRefused is the Pacer refusing an attempt while the context is
// live, as x/time/rate's Limiter.Wait does when the token would come
// after the deadline.
var errPaceRefused = errors.New("sim: the pacer refuses: the next token comes after the deadline")

// pacer is the job's Pacer (Config.Pace): it refuses some attempts.
type pacer struct{ w *world }

func (p pacer) Wait(ctx context.Context) error {
	w := p.w
	w.callback(ctx, "Pacer.Wait")
	if c, ok := ctx.Value(callKey{}).(*call); ok && w.faulty.Load() && !c.p.dead.Load() && w.draw(100, "pace", c.id, c.count("pace")) < w.cfg.Pace {
		c.note("the pacer refuses")
		w.count("pacer refuses")
		return errPaceRefused
	}
	return nil
}

func (pacer) Observe(int, bool) {}

// backoff is the job's Policy.Backoff: linear, and the same on every run
// (the built-in backoff's jitter comes from math/rand's global source,
// which no seed reaches). It gets no context, so no call to tell it
// apart by: in the faulty phase, with panics on, it panics at one retry
// number the seed draws, every call that reaches it, and with blocks on
// it blocks at another, on Resume's goroutines too (see callback).
func (w *world) backoff(p *clientProc, retry int) time.Duration {
	if w.faulty.Load() && !p.dead.Load() {
		if w.cfg.Panic > 0 && retry == 1+w.draw(3, "backoff panics") {
			w.count("callback panics")
			panic(simPanic{"Backoff"})
		}
		if w.cfg.Block > 0 && retry == 1+w.draw(3, "backoff blocks") {
			w.count("callback blocks")
			time.Sleep(time.Duration(1+w.draw(5, "backoff blocks for"))*time.Second + time.Duration(1+w.draw(997, "backoff off", retry))*time.Microsecond) // off the milliseconds, as callback's blocks
		}
	}
	return time.Duration(retry) * 50 * time.Millisecond
}

// note is a line of a call's own for the trace, made on the call's
// goroutine (a callback's panic, say): the driver writes it at its next
// step, in call order, so that two calls' lines made at one virtual
// instant come out in one order.
func (c *call) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notes = append(c.notes, stamped{at: time.Now(), line: fmt.Sprintf("call %d: ", c.id) + fmt.Sprintf(format, args...)})
}

// count returns how many times the call reached where before.
func (c *call) count(where string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	n := c.counts[where]
	c.counts[where]++
	return n
}

type stamped struct {
	at   time.Time
	line string
}

// flushNotes writes the calls' notes to the trace, in call order.
func (w *world) flushNotes() {
	w.mu.Lock()
	calls := w.calls
	w.mu.Unlock()
	for _, c := range calls {
		c.mu.Lock()
		notes := c.notes
		c.notes = nil
		c.mu.Unlock()
		for _, n := range notes {
			w.traceAt(n.at, "%s", n.line)
		}
	}
}

// mintKey is the key a call without one of its own gets from the client
// (internal/simkey): named after the operation and the call, as the
// job's own keys are, so that a run is the same every time.
func mintKey(c *call) func() string {
	n := 0
	return func() string {
		n++
		if n == 1 {
			return fmt.Sprintf("m-%d-%d", c.op, c.id)
		}
		return fmt.Sprintf("m-%d-%d-%d", c.op, c.id, n)
	}
}
