package suite

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemtest"
)

// Every peer's request names its operation the way the server reads it,
// and succeeds once against a server without faults: the tables count
// side effects per operation, so a peer whose operation the server missed
// would look like one that never ran anything.
func TestPeersNameTheirOperation(t *testing.T) {
	for _, name := range append(Peers(), PeerRawKey) {
		t.Run(name, func(t *testing.T) {
			srv := idemtest.NewServer(nil)
			defer srv.Close()
			p, err := newPeer(name, peerConfig{url: srv.URL, timeout: 10 * time.Second, count: true})
			require.NoError(t, err)
			defer p.close()

			r := sendOne(context.Background(), p, "op-x", time.Now())
			require.NoError(t, r.err)
			assert.Equal(t, 200, r.status)
			assert.Equal(t, 1, r.attempts)
			assert.Equal(t, 1, srv.Executions("op-x"))
		})
	}
}

func TestBodyNamesOperation(t *testing.T) {
	assert.Equal(t, "op-00042", idemtest.Operation(formType, Body("op-00042")))
	assert.Equal(t, "a b&c", idemtest.Operation(formType, Body("a b&c")))
}

// The chaos property idemhttp promises: no operation runs twice, none is
// reported done without running, and every failure that ran is pending in
// the journal; after Resume every operation ran exactly once.
func TestChaosIdemhttpRunsEveryOperationOnce(t *testing.T) {
	tests := []struct {
		give Dialect
	}{
		{give: DialectStripe},
		{give: DialectIETF},
	}
	for _, tt := range tests {
		t.Run(string(tt.give), func(t *testing.T) {
			res, err := Chaos(context.Background(), ChaosConfig{
				Peers:       []string{PeerRaw, PeerIdem},
				Ops:         200,
				Concurrency: 16,
				Seed:        7,
				Timeout:     250 * time.Millisecond,
				Dialect:     tt.give,
				Dir:         t.TempDir(),
			})
			require.NoError(t, err)
			require.Len(t, res, 2)
			raw, idem := res[0], res[1]

			// The faults happened, and the harness sees their effects: raw
			// net/http reports failures for operations that ran.
			for _, k := range []idemtest.FaultKind{idemtest.FaultDropRequest, idemtest.FaultDropResponse, idemtest.FaultSlow, idemtest.FaultUnavailable} {
				assert.Positive(t, idem.Server.Faults[k], k)
			}
			assert.Positive(t, raw.FailuresRan)
			assert.Zero(t, raw.Duplicates)
			assert.Equal(t, float64(1), raw.AttemptsPerOp())

			require.True(t, idem.Journaled)
			assert.Zero(t, idem.Duplicates, "executions beyond the first")
			assert.Zero(t, idem.OKNotRun, "reported ok, never ran")
			assert.Zero(t, idem.FailuresRanNotPending, "failed, ran, not pending")
			assert.Zero(t, idem.AfterDuplicates, "executions beyond the first after Resume")
			assert.Zero(t, idem.AfterLost, "never ran and not pending after Resume")
			assert.Equal(t, idem.Ops, idem.AfterRan1+idem.PendingAfter, "after Resume every operation ran once or is pending")
		})
	}
}

// A batch SIGKILLed with operations in flight and rerun from its
// done-file runs those operations twice with raw net/http, and exactly
// once with idemhttp's journal and Resume.
func TestCrashIdemhttpRerunRunsEveryOperationOnce(t *testing.T) {
	res, err := Crash(context.Background(), CrashConfig{
		Peers:       []string{PeerRaw, PeerIdem},
		Ops:         96,
		Concurrency: 16,
		Seed:        3,
		Latency:     60 * time.Millisecond,
		Dir:         t.TempDir(),
	})
	require.NoError(t, err)
	require.Len(t, res, 2)
	raw, idem := res[0], res[1]

	assert.Positive(t, raw.InFlight, "operations ran but not recorded at the kill")
	assert.Positive(t, raw.Duplicates, "the rerun without keys runs them again")
	assert.Zero(t, raw.Ran0)

	assert.Positive(t, idem.InFlight)
	assert.Zero(t, idem.Duplicates)
	assert.Zero(t, idem.RerunFailures)
	assert.Equal(t, idem.Ops, idem.Ran1, "every operation ran exactly once")
}

// During an outage idemhttp's retry budget bounds its attempts, and the
// harness counts one attempt per operation for raw net/http.
func TestOutageAttempts(t *testing.T) {
	res, err := Outage(context.Background(), OutageConfig{
		Peers:      []string{PeerRaw, PeerIdem},
		Ops:        400,
		Span:       400 * time.Millisecond,
		Start:      50 * time.Millisecond,
		Length:     300 * time.Millisecond,
		RetryAfter: -1,
	})
	require.NoError(t, err)
	require.Len(t, res, 2)
	raw, idem := res[0], res[1]
	assert.Equal(t, float64(1), raw.AttemptsPerOp())
	assert.Positive(t, raw.Refused)
	assert.Zero(t, idem.Duplicates)
	assert.LessOrEqual(t, idem.AttemptsPerOp(), 1.5)
}

func TestJournalCostGroupsCommits(t *testing.T) {
	res, err := JournalCost(context.Background(), JournalConfig{Ops: 64, Concurrency: []int{1, 32}, Dir: t.TempDir()})
	require.NoError(t, err)
	require.Len(t, res, 2)
	assert.Equal(t, 64, res[0].Requests)
	// Alone, each entry waits for its own commit and each outcome is
	// written behind, in the next entry's (or, after a pause longer than
	// filejournal.WriteBehind, in one of its own).
	assert.GreaterOrEqual(t, res[0].SyncsPerRequest(), 1.0, "an entry is never sent before its own commit")
	assert.LessOrEqual(t, res[0].SyncsPerRequest(), 2.0)
	assert.Less(t, res[1].SyncsPerRequest(), res[0].SyncsPerRequest())
}

func TestOverhead(t *testing.T) {
	bt := flag.Lookup("test.benchtime")
	require.NotNil(t, bt)
	old := bt.Value.String()
	require.NoError(t, flag.Set("test.benchtime", "20x"))
	defer func() { _ = flag.Set("test.benchtime", old) }()

	res, err := Overhead(context.Background(), OverheadConfig{Peers: []string{PeerIdem}, Runs: 1, ClientRuns: 1, ClientOps: 200})
	require.NoError(t, err)
	require.Len(t, res, 2)
	assert.Equal(t, PeerRaw, res[0].Peer)
	assert.Equal(t, PeerIdem, res[1].Peer)
	assert.Equal(t, float64(1), res[0].Ratio)
	for _, r := range res {
		assert.Positive(t, r.NsPerOp, r.Peer)
		assert.Positive(t, r.AllocsPerOp, r.Peer)
		assert.Positive(t, r.ServerCPU, r.Peer)
		assert.Positive(t, r.AloneCPU, r.Peer)
	}
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	tests := []struct {
		name string
		give []time.Duration
		p    float64
		want time.Duration
	}{
		{name: "empty", give: nil, p: 50, want: 0},
		{name: "one", give: ms(7), p: 99, want: 7 * time.Millisecond},
		{name: "median odd", give: ms(3, 1, 2), p: 50, want: 2 * time.Millisecond},
		{name: "median even takes the lower", give: ms(4, 1, 3, 2), p: 50, want: 2 * time.Millisecond},
		{name: "p99 of 100", give: ms(seq(100)...), p: 99, want: 99 * time.Millisecond},
		{name: "p100", give: ms(5, 9, 1), p: 100, want: 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, percentile(tt.give, tt.p))
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestMedian(t *testing.T) {
	tests := []struct {
		name string
		give []float64
		want float64
	}{
		{name: "empty", give: nil, want: 0},
		{name: "odd", give: []float64{5, 1, 3}, want: 3},
		{name: "even", give: []float64{4, 1, 3, 2}, want: 2.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, median(tt.give))
		})
	}
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		name string
		give []float64
		q    float64
		want float64
	}{
		{name: "empty", give: nil, q: 0.5, want: 0},
		{name: "first quartile", give: []float64{4, 3, 2, 1}, q: 0.25, want: 1},
		{name: "third quartile", give: []float64{4, 3, 2, 1}, q: 0.75, want: 3},
		{name: "max", give: []float64{4, 3, 2, 1}, q: 1, want: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, quantile(tt.give, tt.q))
		})
	}
}

func TestTableColumnsAndSections(t *testing.T) {
	rep := Report{
		Chaos: []ChaosResult{
			{Peer: PeerIdem, Ops: 10, Attempts: 12, Journaled: true},
			{Peer: PeerStripe + " (ietf errors)", Ops: 10, Attempts: 10},
			{Peer: PeerRaw, Ops: 10, Attempts: 10},
			{Peer: PeerStripe, Ops: 10, Attempts: 10},
		},
		ChaosConfig: ChaosConfig{Ops: 10},
		Journal:     []JournalResult{{Concurrency: 1, Requests: 4, Commits: 8}},
	}
	assert.Equal(t, []string{PeerRaw, PeerStripe, PeerStripe + " (ietf errors)", PeerIdem}, rep.peers())
	out := rep.Table()
	assert.Contains(t, out, "| measure ")
	assert.Contains(t, out, "**Chaos: 10 ops")
	assert.Contains(t, out, "**Journal cost")
	assert.Contains(t, out, "2.00 (")
	assert.NotContains(t, out, "Overhead")
}
