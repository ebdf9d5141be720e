package idemtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sequences returns the faults decided for each of ops over attempts
// requests each, the requests interleaved in the order shuffle gives.
func sequences(f Faults, ops []string, attempts int, shuffle *rand.Rand) map[string][]FaultKind {
	type req struct{ op string }
	var order []req
	for _, op := range ops {
		for range attempts {
			order = append(order, req{op})
		}
	}
	if shuffle != nil {
		shuffle.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	states := map[string]*opState{}
	got := map[string][]FaultKind{}
	for _, r := range order {
		st := states[r.op]
		if st == nil {
			st = new(opState)
			states[r.op] = st
		}
		got[r.op] = append(got[r.op], f.decide(st, r.op, true))
	}
	return got
}

func TestDecisionsIgnoreInterleaving(t *testing.T) {
	f := Faults{Seed: 7, DropRequest: 0.1, DropResponse: 0.1, Slow: 0.1, Unavailable: 0.1, Conflict: 0.1, Stored500: 0.1}
	ops := make([]string, 50)
	for i := range ops {
		ops[i] = fmt.Sprint("op-", i)
	}
	want := sequences(f, ops, 6, nil)
	for seed := range uint64(5) {
		got := sequences(f, ops, 6, rand.New(rand.NewPCG(seed, seed)))
		assert.Equal(t, want, got, "interleaving %d", seed)
	}
}

func TestDecisionsDependOnSeed(t *testing.T) {
	ops := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	one := sequences(Faults{Seed: 1, DropRequest: 0.5}, ops, 8, nil)
	two := sequences(Faults{Seed: 2, DropRequest: 0.5}, ops, 8, nil)
	assert.NotEqual(t, one, two)
}

func TestDecisionRates(t *testing.T) {
	tests := []struct {
		name string
		give Faults
		want map[FaultKind]float64 // expected share of 20000 requests
	}{
		{"none", Faults{Seed: 1}, map[FaultKind]float64{"": 1}},
		{"one kind", Faults{Seed: 1, Unavailable: 0.3}, map[FaultKind]float64{"": 0.7, FaultUnavailable: 0.3}},
		{"all", Faults{Seed: 3, DropRequest: 0.1, DropResponse: 0.1, Slow: 0.1, Unavailable: 0.1, Stored500: 0.1},
			map[FaultKind]float64{"": 0.5, FaultDropRequest: 0.1, FaultDropResponse: 0.1, FaultSlow: 0.1, FaultUnavailable: 0.1, FaultStored500: 0.1}},
		{"sum over one starves the last", Faults{Seed: 1, DropRequest: 0.8, Stored500: 0.8}, map[FaultKind]float64{FaultDropRequest: 0.8, FaultStored500: 0.2}},
		{"negative is zero", Faults{Seed: 1, DropRequest: -1}, map[FaultKind]float64{"": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const n = 20000
			counts := map[FaultKind]int{}
			for i := range n {
				counts[tt.give.decide(new(opState), fmt.Sprint("op-", i), true)]++
			}
			for k, share := range tt.want {
				assert.InDelta(t, share*n, counts[k], 0.02*n, "kind %q", k)
			}
			assert.Len(t, counts, len(tt.want))
		})
	}
}

func TestConflictBurstAndCap(t *testing.T) {
	tests := []struct {
		name string
		give Faults
		want []FaultKind
	}{
		// The first request of an operation never draws a 409.
		{"default burst of three", Faults{Conflict: 1, MaxPerOperation: 1}, []FaultKind{"", FaultConflict, FaultConflict, FaultConflict, ""}},
		{"burst of two, twice", Faults{Conflict: 1, ConflictBurst: 2, MaxPerOperation: 2}, []FaultKind{"", FaultConflict, FaultConflict, FaultConflict, FaultConflict, ""}},
		{"cap of one", Faults{DropRequest: 1, MaxPerOperation: 1}, []FaultKind{FaultDropRequest, "", "", "", ""}},
		{"no cap", Faults{DropRequest: 1}, []FaultKind{FaultDropRequest, FaultDropRequest, FaultDropRequest, FaultDropRequest, FaultDropRequest}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := new(opState)
			var got []FaultKind
			for range tt.want {
				got = append(got, tt.give.decide(st, "op", true))
			}
			assert.Equal(t, tt.want, got)
		})
	}
}

// TestSlowReplyEndsWithClose: a slow reply in flight when the server closes
// ends at once, without the empty 200 a silently returning handler would
// send, and Close does not wait out the delay.
func TestSlowReplyEndsWithClose(t *testing.T) {
	waiting := make(chan struct{}, 1)
	srv := newServer(&Options{Faults: Faults{Slow: 1, SlowDelay: time.Hour}}, func() { waiting <- struct{}{} })
	c := srv.Client()
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Post(srv.URL+"/v1/anything", "application/json", strings.NewReader(`{"operation":"op"}`))
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("got a reply: %s", resp.Status)
		}
		errc <- err
	}()
	<-waiting
	srv.Close()
	assert.Error(t, <-errc)
	assert.Equal(t, 1, srv.Executions("op"), "the work was done before the wait")
}

// TestSlowReplyHonoursClientTimeout: when the client gives up, the handler
// stops waiting; goleak in TestMain proves nothing lingers.
func TestSlowReplyHonoursClientTimeout(t *testing.T) {
	waiting := make(chan struct{}, 1)
	srv := newServer(&Options{Faults: Faults{Slow: 1, SlowDelay: time.Hour, MaxPerOperation: 1}}, func() { waiting <- struct{}{} })
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/anything", strings.NewReader(`{"operation":"op"}`))
		if err != nil {
			errc <- err
			return
		}
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-waiting
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)

	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/anything", strings.NewReader(`{"operation":"op"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k1")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get("Idempotent-Replayed"), "the slow attempt's work was stored")
	assert.Equal(t, 1, srv.Executions("op"))
}

func TestStatsConcurrentReads(t *testing.T) {
	srv := NewServer(nil)
	defer srv.Close()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			srv.execute(fmt.Sprint("op", i%2))
			_ = srv.Stats()
			_ = srv.Snapshot()
		}()
	}
	wg.Wait()
	assert.Equal(t, Stats{Executions: 4, Operations: 2, Duplicates: 2, Faults: srv.Stats().Faults}, srv.Stats())
}

func TestKeylessRequestsGetNoConflict(t *testing.T) {
	f := Faults{Seed: 1, Conflict: 1}
	st := new(opState)
	for range 10 {
		assert.Equal(t, FaultKind(""), f.decide(st, "op", false))
	}
	keyed := new(opState)
	assert.Equal(t, FaultKind(""), f.decide(keyed, "op", true), "never to an operation's first request")
	assert.Equal(t, FaultConflict, f.decide(keyed, "op", true))
}

// TestLatencyEndsWithClose: a request waiting out its latency when the
// server closes ends at once without a reply, having run nothing.
func TestLatencyEndsWithClose(t *testing.T) {
	waiting := make(chan struct{}, 1)
	srv := newServer(&Options{Faults: Faults{Latency: time.Hour}}, func() { waiting <- struct{}{} })
	c := srv.Client()
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Post(srv.URL+"/v1/anything", "application/json", strings.NewReader(`{"operation":"op"}`))
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("got a reply: %s", resp.Status)
		}
		errc <- err
	}()
	<-waiting
	srv.Close()
	assert.Error(t, <-errc)
	assert.Zero(t, srv.Executions("op"), "nothing runs before the latency is over")
}

func TestURLHost(t *testing.T) {
	tests := []struct {
		give net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80}, "127.0.0.1:80"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 8080}, "127.0.0.1:8080"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "127.0.0.1:8080"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 9}, "[::1]:9"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, urlHost(tt.give))
	}
}
