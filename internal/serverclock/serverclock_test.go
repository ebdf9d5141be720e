package serverclock_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/internal/serverclock"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// deadlineStore is a store that is not a MemoryStore (so the Middleware
// bounds its calls) and records the deadline of each Claim.
type deadlineStore struct {
	*idemserver.MemoryStore
	left chan time.Duration
}

func (s deadlineStore) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	if dl, ok := ctx.Deadline(); ok {
		s.left <- time.Until(dl)
	}
	return s.MemoryStore.Claim(ctx, key, c)
}

// TestSetReachesTheMiddleware: a clock given through Set is the one the
// Middleware's lock arithmetic reads. With a clock an hour ahead, a
// claim's call is still bounded by the lock timeout, measured on it.
// Checked to fail with idemserver's registered setter doing nothing.
func TestSetReachesTheMiddleware(t *testing.T) {
	store := deadlineStore{MemoryStore: new(idemserver.MemoryStore), left: make(chan time.Duration, 1)}
	mw := &idemserver.Middleware{SingleTenant: true, Store: store, LockTimeout: time.Minute}
	read := false
	serverclock.Set(mw, func() time.Time { read = true; return time.Now().Add(time.Hour) })
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	assert.Equal(t, http.StatusCreated, w.Code)
	assert.True(t, read, "the Middleware read the clock given through Set")
	assert.InDelta(t, time.Minute.Seconds(), (<-store.left).Seconds(), 5)
}

// TestSetRefusesAnythingElse: Set is for an *idemserver.Middleware only.
func TestSetRefusesAnythingElse(t *testing.T) {
	assert.Panics(t, func() { serverclock.Set(idemserver.Middleware{}, time.Now) })
}
