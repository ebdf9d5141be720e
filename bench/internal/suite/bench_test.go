package suite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSend is Overhead as a Go benchmark, for profiling one peer,
// with and without an http.Client.Timeout (which makes net/http start a
// goroutine and a timer per request when the client's Transport is not an
// *http.Transport):
//
//	go test -run '^$' -bench 'Send/timeout=1s/idemhttp' -cpuprofile cpu.out ./bench/internal/suite
//
// The server runs in a child process, so the profile and allocs/op are
// the client's alone. -count runs the sub-benchmarks in turn, so peers
// interleave.
func BenchmarkSend(b *testing.B) {
	srv, err := StartServer(context.Background())
	require.NoError(b, err)
	defer func() { _ = srv.Close() }()
	for _, timeout := range []time.Duration{0, time.Second} {
		for _, name := range []string{PeerRaw, PeerRawKey, PeerRetryable, PeerStripe, PeerIdem} {
			b.Run(fmt.Sprintf("timeout=%s/%s", timeout, name), func(b *testing.B) {
				p, err := newPeer(name, peerConfig{url: srv.URL, timeout: timeout})
				require.NoError(b, err)
				defer p.close()
				ctx := context.Background()
				body := Body("overhead")
				b.ReportAllocs()
				g0 := goroutinesCreated()
				for b.Loop() {
					if _, err := p.Send(ctx, "overhead", body); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(goroutinesCreated()-g0)/float64(b.N), "goroutines/op")
			})
		}
	}
}

// BenchmarkClientOnly is each client's own cost per POST, without a
// network or a server: every client gets a transport that answers at
// once. It isolates what the library adds from what the round trip and
// the server cost. cpu-ns/op is the process's CPU time per POST; with
// -cpu 1 no idle processor spins, so on a shared machine it is the
// steadier measure of the client's work:
//
//	go test -run '^$' -bench ClientOnly -benchmem -cpu 1 -count 5 ./bench/internal/suite
func BenchmarkClientOnly(b *testing.B) {
	for _, name := range []string{PeerRaw, PeerRawKey, PeerRetryable, PeerStripe, PeerIdem} {
		b.Run(name, func(b *testing.B) {
			p, err := newPeer(name, peerConfig{url: "http://stub.invalid"})
			require.NoError(b, err)
			p.hc.Transport = stubTransport{} // before the first request: idemhttp reads it then
			ctx := context.Background()
			body := Body("overhead")
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if _, err := p.Send(ctx, "overhead", body); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
