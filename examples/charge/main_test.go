package main

import (
	"bytes"
	"testing"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/idemtrace"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestChargesRunExactlyOnce(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		var out bytes.Buffer
		require.NoError(t, run(&out, 30, seed), out.String())
		assert.Contains(t, out.String(), "charges: 30 ok, 0 failed")
		assert.Contains(t, out.String(), "charges executed more than once: 0")
	}
}

// TestOutputReadsWell: no raw Go map, no "attempt(s)", and a replay on a
// charge's only attempt is not blamed on an earlier attempt (issue 26).
func TestOutputReadsWell(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(&out, 30, 1), out.String())
	assert.NotContains(t, out.String(), "map[")
	assert.NotContains(t, out.String(), "(s)")
	assert.NotRegexp(t, `  1 attempt\b.*earlier request`, out.String())
	assert.Regexp(t, `(?m)^retries by reason: [a-z_]+ \d+`, out.String())
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		name    string
		give    idemhttp.Info
		retried []idemtrace.RetryReason
		want    string
	}{
		{"first try", idemhttp.Info{Attempts: 1}, nil, ""},
		{"retried then replayed", idemhttp.Info{Attempts: 2, Replayed: true}, []idemtrace.RetryReason{idemtrace.ReasonUnknownOutcome},
			" (retried: unknown_outcome); replayed: an earlier request with the key had made the charge, and its answer was lost"},
		{"replayed on the only attempt", idemhttp.Info{Attempts: 1, Replayed: true}, nil,
			"; replayed: net/http resent the request by itself after its connection died, and the first copy had made the charge"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, describe(tt.give, tt.retried))
		})
	}
	assert.Equal(t, "a 2, b 1", counts(map[string]int{"b": 1, "a": 2, "c": 0}))
	assert.Equal(t, "none", counts(map[string]int{"c": 0}))
}
