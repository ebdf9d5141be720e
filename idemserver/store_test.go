package idemserver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

// failingStore fails every call.
type failingStore struct{}

var errStoreDown = errors.New("store down")

func (failingStore) Claim(context.Context, string, idemserver.Claim) (idemserver.ClaimResult, error) {
	return idemserver.ClaimResult{}, errStoreDown
}

func (failingStore) Complete(context.Context, string, string, []byte, time.Duration) error {
	return errStoreDown
}

func (failingStore) Release(context.Context, string, string) error { return errStoreDown }

func (failingStore) Renew(context.Context, string, string, time.Duration) error { return errStoreDown }

// brokenStore returns a claim result it was never meant to.
type brokenStore struct {
	failingStore
	give idemserver.ClaimResult
}

func (s brokenStore) Claim(_ context.Context, _ string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	res := s.give
	res.Fingerprint = c.Fingerprint
	return res, nil
}

// TestInvalidClaimResult: a store bug is answered with 503, never with a
// handler run that the claim did not grant, nor with a panic.
func TestInvalidClaimResult(t *testing.T) {
	tests := []struct {
		name string
		give idemserver.ClaimResult
	}{
		{"zero state", idemserver.ClaimResult{}},
		{"unknown state", idemserver.ClaimResult{State: 9}},
		{"completed without a record", idemserver.ClaimResult{State: idemserver.Completed}},
		{"completed with a corrupt record", idemserver.ClaimResult{State: idemserver.Completed, Record: []byte{1, 0xff}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := new(app)
			h := (&idemserver.Middleware{SingleTenant: true, Store: brokenStore{give: tt.give}, Logger: slog.New(slog.DiscardHandler)}).Wrap(a)
			w := serve(h, req{key: "k1"})
			assert.Equal(t, http.StatusServiceUnavailable, w.Code)
			assert.Zero(t, a.calls.Load())
		})
	}
}

func TestStoreUnavailable(t *testing.T) {
	a := new(app)
	h := (&idemserver.Middleware{SingleTenant: true, Store: failingStore{}, Logger: slog.New(slog.DiscardHandler)}).Wrap(a)
	w := serve(h, req{key: "k1"})
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Equal(t, idemserver.TypeStoreUnavailable, problemType(w))
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Zero(t, a.calls.Load(), "without a claim the handler must not run")
}

// spyStore keeps the last record completed.
type spyStore struct {
	idemserver.MemoryStore
	mu   sync.Mutex
	last []byte
}

func (s *spyStore) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	s.mu.Lock()
	s.last = record
	s.mu.Unlock()
	return s.MemoryStore.Complete(ctx, key, token, record, ttl)
}

// TestStoredRecordFormat: what the middleware hands the store is the
// documented record format, which Response.UnmarshalBinary reads.
func TestStoredRecordFormat(t *testing.T) {
	store := new(spyStore)
	h := (&idemserver.Middleware{SingleTenant: true, Store: store}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "11")
		w.Header().Set("Connection", "close")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, `{"id":"x"}`+"\n")
		w.Header().Set("X-Too-Late", "not sent, not stored")
	}))
	serve(h, req{key: "k1"})

	var got idemserver.Response
	require.NoError(t, got.UnmarshalBinary(store.last))
	assert.Equal(t, idemserver.Response{
		Status: http.StatusAccepted,
		Header: http.Header{"Content-Type": {"application/json"}, "Content-Length": {"11"}},
		Body:   []byte(`{"id":"x"}` + "\n"),
	}, got)
	assert.Equal(t, len(store.last), cap(store.last), "sized by Content-Length: no slack kept for a day")
}
