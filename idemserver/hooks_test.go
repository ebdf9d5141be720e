package idemserver_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// hookLog records the events of every hook, with latencies checked and
// then cleared, and errors reduced to their text, so rows compare them.
type hookLog struct {
	mu        sync.Mutex
	events    []any
	latencies []time.Duration
}

func (l *hookLog) add(ev any, lat time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, ev)
	l.latencies = append(l.latencies, lat)
}

func (l *hookLog) take() []any {
	l.mu.Lock()
	defer l.mu.Unlock()
	evs := l.events
	l.events, l.latencies = nil, nil
	return evs
}

// errText stands for an event's error in a row's wanted events.
type errText string

func errOf(err error) errText {
	if err == nil {
		return ""
	}
	return errText(err.Error())
}

// storeErr and refused are StoreErrorEvent and RefusedEvent with their
// errors as text.
type storeErr struct {
	idemserver.RequestEvent
	Op     idemserver.StoreOp
	Status int
	Err    errText
}

type refused struct {
	idemserver.RequestEvent
	Reason idemserver.RefusalReason
	Status int
	Err    errText
}

type renewFailed struct {
	idemserver.RequestEvent
	Lost bool
	Err  errText
}

// hooks returns Hooks recording into l.
func (l *hookLog) hooks(record bool) *idemserver.Hooks {
	return &idemserver.Hooks{
		RecordScope: record,
		RecordKey:   record,
		OnClaim: func(_ context.Context, ev idemserver.ClaimEvent) {
			lat := ev.Latency
			ev.Latency = 0
			l.add(ev, lat)
		},
		OnStored: func(_ context.Context, ev idemserver.StoredEvent) {
			lat := ev.Latency
			ev.Latency = 0
			l.add(ev, lat)
		},
		OnReleased: func(_ context.Context, ev idemserver.ReleasedEvent) {
			lat := ev.Latency
			ev.Latency = 0
			l.add(ev, lat)
		},
		OnRenewFailed: func(_ context.Context, ev idemserver.RenewFailedEvent) {
			l.add(renewFailed{ev.RequestEvent, ev.Lost, errOf(ev.Err)}, 1)
		},
		OnStoreError: func(_ context.Context, ev idemserver.StoreErrorEvent) {
			l.add(storeErr{ev.RequestEvent, ev.Op, ev.Status, errOf(ev.Err)}, 1)
		},
		OnRefused: func(_ context.Context, ev idemserver.RefusedEvent) {
			l.add(refused{ev.RequestEvent, ev.Reason, ev.Status, errOf(ev.Err)}, 1)
		},
	}
}

// faultStore is a MemoryStore whose operations can be made to fail or, for
// Claim, to answer a given result.
type faultStore struct {
	*idemserver.MemoryStore
	claim                         *idemserver.ClaimResult
	claimErr, completeErr, relErr error
}

func (s *faultStore) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	switch {
	case s.claimErr != nil:
		return idemserver.ClaimResult{}, s.claimErr
	case s.claim != nil:
		return *s.claim, nil
	}
	return s.MemoryStore.Claim(ctx, key, c)
}

func (s *faultStore) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if s.completeErr != nil {
		return s.completeErr
	}
	return s.MemoryStore.Complete(ctx, key, token, record, ttl)
}

func (s *faultStore) Release(ctx context.Context, key, token string) error {
	if s.relErr != nil {
		return s.relErr
	}
	return s.MemoryStore.Release(ctx, key, token)
}

// hookApp picks its answer by path: /charges 201, /fail 500, /busy 409,
// /big 4 KiB, /switch answers 101 Switching Protocols, /cancel waits for the client to leave and answers nothing,
// /panic panics.
var hookApp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/fail":
		w.WriteHeader(http.StatusInternalServerError)
	case "/busy":
		w.WriteHeader(http.StatusConflict)
	case "/big":
		_, _ = w.Write([]byte(strings.Repeat("x", 4096)))
	case "/switch":
		w.WriteHeader(http.StatusSwitchingProtocols)
	case "/cancel":
		<-r.Context().Done()
	case "/panic":
		panic(http.ErrAbortHandler)
	default:
		w.WriteHeader(http.StatusCreated)
	}
})

// serveHook sends q to h, with a cancelled context when cancel is set, and
// swallows the handler's panic as net/http would.
func serveHook(h http.Handler, q req, cancel bool) {
	r := q.build()
	if cancel {
		ctx, stop := context.WithCancel(r.Context())
		stop()
		r = r.WithContext(ctx)
	}
	defer func() { _ = recover() }()
	h.ServeHTTP(httptest.NewRecorder(), r)
}

var errDown = errors.New("store down")

// TestHooksEvents: each decision of the middleware reaches its hook, with
// the request's method and path (no query), the scope and key only when
// recorded, and the status. (Checked to fail with each hook call removed
// from middleware.go in turn.)
func TestHooksEvents(t *testing.T) {
	ev := func(path string) idemserver.RequestEvent {
		return idemserver.RequestEvent{Method: http.MethodPost, Path: path, Scope: "t1", Key: "k1"}
	}
	charges := ev("/charges")
	claimed := idemserver.ClaimEvent{RequestEvent: charges, Outcome: idemserver.ClaimNew}
	newStore := func() *faultStore { return &faultStore{MemoryStore: new(idemserver.MemoryStore)} }
	corrupt := &idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: "/charges", Record: []byte("junk")}
	inProgress := &idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: "/charges"}
	tests := []struct {
		name   string
		give   req
		prior  []req // sent first; their events are not checked
		store  *faultStore
		mw     idemserver.Middleware // Store, Hooks, Principal and Fingerprint set by the loop
		cancel bool
		record bool // RecordScope and RecordKey; true unless noRecord
		want   []any
	}{
		{
			name: "new, stored",
			give: req{target: "/charges?card=4242", key: "k1"},
			want: []any{claimed, idemserver.StoredEvent{RequestEvent: charges, Status: http.StatusCreated, Replayable: true}},
		},
		{
			name:  "replay",
			give:  req{key: "k1"},
			prior: []req{{key: "k1"}},
			want:  []any{idemserver.ClaimEvent{RequestEvent: charges, Outcome: idemserver.ClaimReplay, Status: http.StatusCreated}},
		},
		{
			name:  "in progress",
			give:  req{key: "k1"},
			store: &faultStore{MemoryStore: new(idemserver.MemoryStore), claim: inProgress},
			want:  []any{idemserver.ClaimEvent{RequestEvent: charges, Outcome: idemserver.ClaimInProgress, Status: http.StatusConflict}},
		},
		{
			name:  "mismatch",
			give:  req{key: "k1", body: "other"},
			prior: []req{{key: "k1"}},
			want:  []any{idemserver.ClaimEvent{RequestEvent: charges, Outcome: idemserver.ClaimMismatch, Status: http.StatusUnprocessableEntity}},
		},
		{
			name:  "not replayable",
			give:  req{target: "/big", key: "k1"},
			prior: []req{{target: "/big", key: "k1"}},
			mw:    idemserver.Middleware{MaxStoredBody: 1024},
			want:  []any{idemserver.ClaimEvent{RequestEvent: ev("/big"), Outcome: idemserver.ClaimNotReplayable, Status: http.StatusGone}},
		},
		{
			name: "stored, too large to replay",
			give: req{target: "/big", key: "k1"},
			mw:   idemserver.Middleware{MaxStoredBody: 1024},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/big"), Outcome: idemserver.ClaimNew},
				idemserver.StoredEvent{RequestEvent: ev("/big"), Status: http.StatusOK, Replayable: false},
			},
		},
		{
			name: "released, 5xx",
			give: req{target: "/fail", key: "k1"},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/fail"), Outcome: idemserver.ClaimNew},
				idemserver.ReleasedEvent{RequestEvent: ev("/fail"), Reason: idemserver.ReleaseServerError, Status: http.StatusInternalServerError},
			},
		},
		{
			name: "released, not stored",
			give: req{target: "/busy", key: "k1"},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/busy"), Outcome: idemserver.ClaimNew},
				idemserver.ReleasedEvent{RequestEvent: ev("/busy"), Reason: idemserver.ReleaseNotStored, Status: http.StatusConflict},
			},
		},
		{
			name: "stored, switched protocols",
			give: req{target: "/switch", key: "k1"},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/switch"), Outcome: idemserver.ClaimNew},
				idemserver.StoredEvent{RequestEvent: ev("/switch"), Status: http.StatusSwitchingProtocols, Replayable: false},
			},
		},
		{
			name:   "released, cancelled",
			give:   req{target: "/cancel", key: "k1"},
			cancel: true,
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/cancel"), Outcome: idemserver.ClaimNew},
				idemserver.ReleasedEvent{RequestEvent: ev("/cancel"), Reason: idemserver.ReleaseCanceled},
			},
		},
		{
			name: "released, panic",
			give: req{target: "/panic", key: "k1"},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/panic"), Outcome: idemserver.ClaimNew},
				idemserver.ReleasedEvent{RequestEvent: ev("/panic"), Reason: idemserver.ReleasePanic},
			},
		},
		{
			name:  "store error, claim",
			give:  req{key: "k1"},
			store: &faultStore{MemoryStore: new(idemserver.MemoryStore), claimErr: errDown},
			want:  []any{storeErr{charges, idemserver.StoreOpClaim, http.StatusServiceUnavailable, "store down"}},
		},
		{
			name:  "store error, corrupt record",
			give:  req{key: "k1"},
			store: &faultStore{MemoryStore: new(idemserver.MemoryStore), claim: corrupt},
			want:  []any{storeErr{charges, idemserver.StoreOpReplay, http.StatusServiceUnavailable, "idemserver: corrupt response record: unknown format"}},
		},
		{
			name:  "store error, complete",
			give:  req{key: "k1"},
			store: &faultStore{MemoryStore: new(idemserver.MemoryStore), completeErr: errDown},
			mw:    idemserver.Middleware{LockTimeout: 100 * time.Millisecond}, // tried again until the lock runs out
			want:  []any{claimed, storeErr{charges, idemserver.StoreOpComplete, http.StatusCreated, "store down"}},
		},
		{
			name:  "store error, release",
			give:  req{target: "/fail", key: "k1"},
			store: &faultStore{MemoryStore: new(idemserver.MemoryStore), relErr: errDown},
			mw:    idemserver.Middleware{LockTimeout: 100 * time.Millisecond},
			want: []any{
				idemserver.ClaimEvent{RequestEvent: ev("/fail"), Outcome: idemserver.ClaimNew},
				storeErr{ev("/fail"), idemserver.StoreOpRelease, http.StatusInternalServerError, "store down"},
			},
		},
		{
			name:  "refused, store full",
			give:  req{key: "k1"},
			prior: []req{{key: "k0"}},
			store: &faultStore{MemoryStore: &idemserver.MemoryStore{MaxEntries: 1}},
			want: []any{refused{charges, idemserver.RefusedStoreFull, http.StatusServiceUnavailable,
				"idemserver: store full"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log hookLog
			store := tt.store
			if store == nil {
				store = newStore()
			}
			mw := tt.mw
			mw.Store, mw.Principal, mw.Hooks = store, tenantOf, log.hooks(true)
			mw.Logger = slog.New(slog.DiscardHandler)
			mw.Fingerprint = func(r *http.Request, body []byte) string { return r.URL.Path + string(body) }
			h := mw.Wrap(hookApp)
			for _, q := range tt.prior {
				q.tenant = "t1"
				serveHook(h, q, false)
			}
			log.take()
			tt.give.tenant = "t1"
			serveHook(h, tt.give, tt.cancel)
			assert.Equal(t, tt.want, log.take())
		})
	}
}

// TestHooksLatency: claims carry the store's latency, stored and released
// keys the time since the claim.
func TestHooksLatency(t *testing.T) {
	var log hookLog
	h := (&idemserver.Middleware{SingleTenant: true, Hooks: log.hooks(false)}).Wrap(hookApp)
	serveHook(h, req{key: "k1"}, false)
	serveHook(h, req{target: "/fail", key: "k2"}, false)
	log.mu.Lock()
	defer log.mu.Unlock()
	require.Len(t, log.latencies, 4)
	for i, lat := range log.latencies {
		assert.Positive(t, lat, "event %d: %#v", i, log.events[i])
	}
}

// TestHooksRecordNothingByDefault: without RecordScope and RecordKey the
// events carry neither, since a scope may name a tenant and a key fetches
// a stored response.
func TestHooksRecordNothingByDefault(t *testing.T) {
	var log hookLog
	h := (&idemserver.Middleware{Principal: tenantOf, Hooks: log.hooks(false)}).Wrap(hookApp)
	serveHook(h, req{target: "/charges?card=4242", key: "k1", tenant: "t1"}, false)
	plain := idemserver.RequestEvent{Method: http.MethodPost, Path: "/charges"}
	assert.Equal(t, []any{
		idemserver.ClaimEvent{RequestEvent: plain, Outcome: idemserver.ClaimNew},
		idemserver.StoredEvent{RequestEvent: plain, Status: http.StatusCreated, Replayable: true},
	}, log.take())
}

// TestHooksNoPrincipal: a request the Principal cannot name is reported
// as refused, and nothing else.
func TestHooksNoPrincipal(t *testing.T) {
	var log hookLog
	h := (&idemserver.Middleware{Principal: tenantOf, Hooks: log.hooks(true), Logger: slog.New(slog.DiscardHandler)}).Wrap(hookApp)
	serveHook(h, req{key: "k1"}, false)
	evs := log.take()
	require.Len(t, evs, 1)
	r, ok := evs[0].(refused)
	require.True(t, ok, "%#v", evs[0])
	assert.Equal(t, idemserver.RequestEvent{Method: http.MethodPost, Path: "/charges", Key: "k1"}, r.RequestEvent)
	assert.Equal(t, idemserver.RefusedNoPrincipal, r.Reason)
	assert.Equal(t, http.StatusInternalServerError, r.Status)
	assert.Contains(t, string(r.Err), "empty scope")
}

// TestHooksCopied: Wrap copies the Hooks, so changing them later does not
// reach a wrapped handler.
func TestHooksCopied(t *testing.T) {
	var calls atomic.Int64
	hk := &idemserver.Hooks{OnClaim: func(context.Context, idemserver.ClaimEvent) { calls.Add(1) }}
	h := (&idemserver.Middleware{SingleTenant: true, Hooks: hk}).Wrap(hookApp)
	hk.OnClaim = nil
	serveHook(h, req{key: "k1"}, false)
	assert.Equal(t, int64(1), calls.Load())
}

// TestHooksRenewFailed: a failed renewal reaches OnRenewFailed, lost or
// not, before the handler's outcome.
func TestHooksRenewFailed(t *testing.T) {
	for _, tt := range []struct {
		give error
		lost bool
	}{{give: errDown}, {give: idemserver.ErrClaimLost, lost: true}} {
		t.Run(tt.give.Error(), func(t *testing.T) {
			const lock = 30 * time.Millisecond
			var log hookLog
			store := &renewSpy{MemoryStore: new(idemserver.MemoryStore), fail: tt.give}
			h := (&idemserver.Middleware{
				SingleTenant: true, Store: store, LockTimeout: lock, Hooks: log.hooks(true),
				Logger: slog.New(slog.DiscardHandler),
			}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for store.renews.Load() == 0 {
					<-time.After(lock / 6)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			serveHook(h, req{key: "k1"}, false)
			evs := log.take()
			// The renewal is waited for before the outcome: stop waits.
			require.GreaterOrEqual(t, len(evs), 3, "%#v", evs)
			ev := idemserver.RequestEvent{Method: http.MethodPost, Path: "/charges", Key: "k1"}
			assert.Equal(t, renewFailed{ev, tt.lost, errOf(tt.give)}, evs[1])
		})
	}
}
