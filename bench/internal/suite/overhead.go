package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// OverheadConfig configures [Overhead]. A zero field means the default in
// its comment.
type OverheadConfig struct {
	Peers []string // nil means [Peers]; PeerRaw is added first if missing, as the baseline
	Runs  int      // benchmark runs per peer, interleaved; 0 means 60

	// Timeout is every peer's http.Client.Timeout; 0 means 1 s, a
	// negative value none. It costs net/http a context and a timer per
	// request, and a goroutine too when the client's Transport is not an
	// *http.Transport.
	Timeout time.Duration

	// ClientRuns and ClientOps size the client-alone measure: rounds of
	// ClientOps POSTs per peer to a stub transport; 0 means 10 and 20000.
	ClientRuns, ClientOps int

	// Progress, when set, is called after each benchmark run.
	Progress func(peer string, run int, r testing.BenchmarkResult)
}

// The extra metrics of an overhead run.
const (
	metricServerCPU  = "server-cpu-ns/op" // CPU of the server's process
	metricGoroutines = "goroutines/op"    // goroutines the client started
)

// OverheadResult is one peer's per-request cost: medians over the runs.
type OverheadResult struct {
	Peer        string  // the peer; the table's column
	NsPerOp     float64 // wall time of one POST, round trip included
	AllocsPerOp float64 // allocations of the client
	BytesPerOp  float64 // bytes allocated by the client
	Goroutines  float64 // goroutines the client started per POST
	ServerCPU   float64 // CPU ns per POST of the server process

	// AloneCPU is the client's own CPU ns per POST with no network, no
	// server (a transport that answers at once) and no Timeout, on one
	// processor, and AloneRatio its median per-round ratio to raw's: the
	// library's own cost, steady on a shared machine where round trips are
	// not.
	AloneCPU, AloneRatio float64

	// Ratio is the median over rounds of NsPerOp over raw's in the same
	// round: the runs of a round are neighbours in time, so the ratio
	// cancels most of the drift in the machine's load. RatioQ1 and RatioQ3
	// are the quartiles of those per-round ratios: their spread is the
	// noise the median is taken over.
	Ratio, RatioQ1, RatioQ3 float64

	Runs []testing.BenchmarkResult
}

// Overhead measures each peer sending one POST at a time with
// [testing.Benchmark], in cfg.Runs rounds, rotating the order of the peers
// in every round so that each peer runs early and late, and reports the
// medians. Each peer keeps one client, and so one warm connection, for all
// its runs. The length of a run is testing's -test.benchtime (1 s unless
// the program set that flag after [testing.Init]): on a shared machine,
// many short runs (a hundred iterations) pair the peers more closely in
// time than a few long ones, and their medians are steadier.
//
// The server, idemtest without faults, runs in a child process, so that
// allocs/op, B/op and goroutines/op count the client alone; ns/op is the
// round trip, server included, with both processes on the same cores. Each
// peer's own CPU without network or server is measured after the rounds
// (see OverheadResult.AloneCPU).
func Overhead(ctx context.Context, cfg OverheadConfig) ([]OverheadResult, error) {
	if cfg.Peers == nil {
		cfg.Peers = Peers()
	}
	peers := []string{PeerRaw}
	for _, p := range cfg.Peers {
		if p != PeerRaw {
			peers = append(peers, p)
		}
	}
	if cfg.Runs <= 0 {
		cfg.Runs = 60
	}
	switch {
	case cfg.Timeout == 0:
		cfg.Timeout = time.Second
	case cfg.Timeout < 0:
		cfg.Timeout = 0
	}
	srv, err := StartServer(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.Close() }()

	clients := make(map[string]*peer, len(peers))
	for _, name := range peers {
		p, err := newPeer(name, peerConfig{url: srv.URL, timeout: cfg.Timeout})
		if err != nil {
			return nil, err
		}
		defer p.close()
		clients[name] = p
	}
	runs := make(map[string][]testing.BenchmarkResult, len(peers))
	ratios := make(map[string][]float64, len(peers))
	for run := range cfg.Runs {
		round := make(map[string]float64, len(peers))
		for i := range peers {
			name := peers[(i+run)%len(peers)]
			r, err := benchPeer(ctx, clients[name], srv)
			if err != nil {
				return nil, fmt.Errorf("overhead %s: %w", name, err)
			}
			runs[name] = append(runs[name], r)
			round[name] = float64(r.NsPerOp())
			if cfg.Progress != nil {
				cfg.Progress(name, run, r)
			}
		}
		for _, name := range peers {
			ratios[name] = append(ratios[name], round[name]/round[PeerRaw])
		}
	}

	out := make([]OverheadResult, 0, len(peers))
	for _, name := range peers {
		var ns, allocs, bytes, gs, scpu []float64
		for _, r := range runs[name] {
			ns = append(ns, float64(r.NsPerOp()))
			allocs = append(allocs, float64(r.AllocsPerOp()))
			bytes = append(bytes, float64(r.AllocedBytesPerOp()))
			gs = append(gs, r.Extra[metricGoroutines])
			scpu = append(scpu, r.Extra[metricServerCPU])
		}
		out = append(out, OverheadResult{
			Peer:        name,
			NsPerOp:     median(ns),
			AllocsPerOp: median(allocs),
			BytesPerOp:  median(bytes),
			Goroutines:  median(gs),
			ServerCPU:   median(scpu),
			Ratio:       median(ratios[name]),
			RatioQ1:     quantile(ratios[name], 0.25),
			RatioQ3:     quantile(ratios[name], 0.75),
			Runs:        runs[name],
		})
	}
	if err := clientAlone(ctx, peers, cfg, out); err != nil {
		return nil, err
	}
	return out, nil
}

// clientAlone measures each peer's own CPU per POST against a transport
// that answers at once, on one processor so that no idle processor spins,
// and fills AloneCPU and AloneRatio of out (in peers order). The clients
// have no Timeout: with one, net/http would start a timer goroutine per
// request for every client here, since the stub is not an *http.Transport,
// and that would hide the one peer that pays it in the round trip.
func clientAlone(ctx context.Context, peers []string, cfg OverheadConfig, out []OverheadResult) error {
	if cfg.ClientRuns <= 0 {
		cfg.ClientRuns = 10
	}
	if cfg.ClientOps <= 0 {
		cfg.ClientOps = 20000
	}
	clients := make([]*peer, len(peers))
	for i, name := range peers {
		p, err := newPeer(name, peerConfig{url: "http://stub.invalid"})
		if err != nil {
			return err
		}
		p.hc.Transport = stubTransport{} // before the first request: idemhttp reads it then
		clients[i] = p
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	body := Body("overhead")
	cpu := make([][]float64, len(peers))
	ratios := make([][]float64, len(peers))
	for run := range cfg.ClientRuns {
		round := make([]float64, len(peers))
		for j := range peers {
			i := (j + run) % len(peers)
			runtime.GC() // start every run with the same heap
			cpu0 := processCPU()
			for range cfg.ClientOps {
				if _, err := clients[i].Send(ctx, "overhead", body); err != nil {
					return fmt.Errorf("overhead %s alone: %w", peers[i], err)
				}
			}
			round[i] = float64(processCPU()-cpu0) / float64(cfg.ClientOps)
			cpu[i] = append(cpu[i], round[i])
		}
		for i := range peers {
			ratios[i] = append(ratios[i], round[i]/round[0])
		}
	}
	for i := range peers {
		out[i].AloneCPU, out[i].AloneRatio = median(cpu[i]), median(ratios[i])
	}
	return nil
}

// stubTransport answers every request at once with a small charge, with
// no network: what remains of a round trip is the client's own work.
type stubTransport struct{}

func (stubTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	const charge = `{"id":"ch_1","object":"charge","amount":1000,"currency":"usd","status":"succeeded"}`
	return &http.Response{
		StatusCode:    http.StatusOK,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(charge)),
		ContentLength: int64(len(charge)),
		Request:       r,
	}, nil
}

// benchPeer benchmarks one peer.
func benchPeer(ctx context.Context, p *peer, srv *ChildServer) (testing.BenchmarkResult, error) {
	const op = "overhead"
	body := Body(op)
	var benchErr error
	fail := func(err error) {
		if benchErr == nil {
			benchErr = err
		}
	}
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		server0, err := srv.CPU()
		if err != nil {
			fail(err)
			b.SkipNow()
		}
		g0 := goroutinesCreated()
		for b.Loop() {
			if _, err := p.Send(ctx, op, body); err != nil {
				fail(err)
				b.SkipNow()
			}
		}
		b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), metricGoroutines)
		server, err := srv.CPU()
		if err != nil {
			fail(err)
			b.SkipNow()
		}
		b.ReportMetric(float64(server-server0)/float64(b.N), metricServerCPU)
	})
	if benchErr != nil {
		return r, benchErr
	}
	if r.N == 0 {
		return r, errors.New("benchmark did not run")
	}
	return r, nil
}
