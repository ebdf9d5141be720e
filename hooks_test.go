package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder writes every event as a line, so a test compares the sequence.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

func (r *recorder) Lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

type traceIDKey struct{}

// hooks returns Hooks recording into r. OnCallStart puts a value in the
// call's context, and every later hook checks it is there.
func (r *recorder) hooks() *idemtrace.Hooks {
	seen := func(ctx context.Context) string {
		if v, _ := ctx.Value(traceIDKey{}).(string); v != "" {
			return v
		}
		return "-"
	}
	return &idemtrace.Hooks{
		OnCallStart: func(ctx context.Context, ev idemtrace.CallEvent) context.Context {
			r.add("start %s keyed=%t", ev.Method, ev.Key != "")
			return context.WithValue(ctx, traceIDKey{}, "t1")
		},
		OnAttempt: func(ctx context.Context, ev idemtrace.AttemptEvent) { r.add("attempt %d %s", ev.Attempt, seen(ctx)) },
		OnAttemptDone: func(ctx context.Context, ev idemtrace.AttemptDoneEvent) {
			r.add("done %d status=%d class=%q err=%t %s", ev.Attempt, ev.Status, ev.Class, ev.Err != nil, seen(ctx))
		},
		OnRetry: func(ctx context.Context, ev idemtrace.RetryEvent) {
			r.add("retry %d %s %s", ev.Attempt, ev.Reason, seen(ctx))
		},
		OnBudgetRefused: func(ctx context.Context, ev idemtrace.BudgetEvent) {
			r.add("budget cost=%d tokens=%d %s", ev.Cost, ev.Tokens, seen(ctx))
		},
		OnGiveUp: func(ctx context.Context, ev idemtrace.GiveUpEvent) {
			r.add("giveup %v %s", ev.Err.(*GiveUpError).Reason, seen(ctx))
		},
		OnCallDone: func(ctx context.Context, ev idemtrace.CallDoneEvent) {
			r.add("end attempts=%d status=%d err=%t %s", ev.Attempts, ev.Status, ev.Err != nil, seen(ctx))
		},
		OnJournal: func(_ context.Context, ev idemtrace.JournalEvent) {
			r.add("journal %s state=%s existing=%t err=%t", ev.Op, ev.State, ev.Existing, ev.Err != nil)
		},
	}
}

func TestHooksSeeEveryDecisionInOrder(t *testing.T) {
	tests := []struct {
		name   string
		steps  []step
		policy *Policy
		ctx    func(context.Context) context.Context
		want   []string
	}{
		{
			name:  "two retries then success, journaled operation",
			steps: []step{reply(503, ""), reply(500, ""), reply(200, "{}")},
			ctx:   func(ctx context.Context) context.Context { return WithOperation(ctx, "order-1") },
			want: []string{
				"journal begin state=pending existing=false err=false",
				"start POST keyed=true",
				"attempt 1 t1", `done 1 status=503 class="" err=false t1`, "retry 2 unavailable t1",
				"attempt 2 t1", `done 2 status=500 class="" err=false t1`, "retry 3 server_error t1",
				"attempt 3 t1", `done 3 status=200 class="" err=false t1`,
				"journal finish state=done existing=false err=false",
				"end attempts=3 status=200 err=false t1",
			},
		},
		{
			name:   "exhausted",
			steps:  []step{reply(503, "")},
			policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond},
			want: []string{
				"start POST keyed=true",
				"attempt 1 t1", `done 1 status=503 class="" err=false t1`, "retry 2 unavailable t1",
				"attempt 2 t1", `done 2 status=503 class="" err=false t1`,
				"giveup retries exhausted t1",
				"end attempts=2 status=503 err=true t1",
			},
		},
		{
			name:   "budget refused",
			steps:  []step{reply(503, "")},
			policy: &Policy{BaseDelay: time.Millisecond, Budget: Budget{Capacity: 7, RetryCost: 5}},
			want: []string{
				"start POST keyed=true",
				"attempt 1 t1", `done 1 status=503 class="" err=false t1`, "retry 2 unavailable t1",
				"attempt 2 t1", `done 2 status=503 class="" err=false t1`,
				"budget cost=5 tokens=2 t1",
				"giveup retry budget exhausted t1",
				"end attempts=2 status=503 err=true t1",
			},
		},
		{
			name:   "unknown outcome of a keyed POST is retried",
			steps:  []step{drop, reply(200, "{}")},
			policy: fast(),
			want: []string{
				"start POST keyed=true",
				"attempt 1 t1", `done 1 status=0 class="unknown_outcome" err=true t1`, "retry 2 unknown_outcome t1",
				"attempt 2 t1", `done 2 status=200 class="" err=false t1`,
				"end attempts=2 status=200 err=false t1",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, tt.steps...)
			rec := &recorder{}
			pol := tt.policy
			if pol == nil {
				pol = fast()
			}
			c := &Client{Policy: pol, Hooks: rec.hooks()}
			req := post(t, srv.URL, chargeBody)
			if tt.ctx != nil {
				req = req.WithContext(tt.ctx(req.Context()))
			}
			resp, err := c.Do(req)
			if resp != nil {
				resp.Body.Close()
			}
			assert.Equal(t, tt.want, rec.Lines())
			_ = err
		})
	}
}

func TestHooksNotSentClassAndLatency(t *testing.T) {
	var classes []idemtrace.ErrorClass
	var latencies []time.Duration
	c := &Client{Policy: &Policy{MaxAttempts: 2, BaseDelay: time.Millisecond}, Hooks: &idemtrace.Hooks{
		OnAttemptDone: func(_ context.Context, ev idemtrace.AttemptDoneEvent) {
			classes = append(classes, ev.Class)
			latencies = append(latencies, ev.Latency)
		},
	}}
	_, err := c.Do(post(t, "http://"+deadAddr(t), chargeBody))
	require.ErrorIs(t, err, ErrExhausted)
	assert.Equal(t, []idemtrace.ErrorClass{idemtrace.ClassNotSent, idemtrace.ClassNotSent}, classes)
	for _, l := range latencies {
		assert.Positive(t, l, "an attempt is timed whenever OnAttemptDone is set")
	}
}

// A call that stops before its first attempt still ends the call it
// started, and reports the withdrawn journal entry.
func TestHooksCallThatNeverSent(t *testing.T) {
	rec := &recorder{}
	c := &Client{Hooks: rec.hooks(), PrepareRequest: func(*http.Request) error { return fmt.Errorf("no credentials") }}
	req := post(t, "http://127.0.0.1:1", chargeBody)
	req = req.WithContext(WithOperation(req.Context(), "op-2"))
	_, err := c.Do(req)
	require.Error(t, err)
	assert.Equal(t, []string{
		"journal begin state=pending existing=false err=false",
		"start POST keyed=true",
		"journal discard state= existing=false err=false",
		"end attempts=0 status=0 err=true t1",
	}, rec.Lines(), "the journal is written before the call ends, as a finish is")
}

func TestHooksReportResume(t *testing.T) {
	srv := newScripted(t, drop, reply(200, "{}"))
	var ops []idemtrace.JournalOp
	c := &Client{Policy: &Policy{MaxAttempts: 1}, Hooks: &idemtrace.Hooks{OnJournal: func(_ context.Context, ev idemtrace.JournalEvent) { ops = append(ops, ev.Op) }}}
	req := post(t, srv.URL, chargeBody)
	req = req.WithContext(WithOperation(req.Context(), "op-3"))
	_, err := c.Do(req)
	require.Error(t, err)
	res, err := c.Resume(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NoError(t, res[0].Err)
	assert.Equal(t, []idemtrace.JournalOp{idemtrace.JournalBegin, idemtrace.JournalFinish, idemtrace.JournalResume, idemtrace.JournalFinish}, ops,
		"a resend rereads its entry; it never begins one")
}

// Hooks run on each call's goroutine with the call's own state: many
// calls at once share nothing but the hooks themselves (run with -race).
func TestHooksConcurrentCalls(t *testing.T) {
	srv := newScripted(t, reply(200, "{}"))
	rec := &recorder{}
	c := &Client{Policy: fast(), Hooks: rec.hooks()}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				resp, err := c.Do(post(t, srv.URL, chargeBody))
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	count := map[string]int{}
	for _, l := range rec.Lines() {
		count[strings.Fields(l)[0]]++
	}
	assert.Equal(t, map[string]int{"start": 40, "attempt": 40, "done": 40, "end": 40}, count)
}
