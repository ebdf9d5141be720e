package main

import (
	"bytes"
	"testing"

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
		assert.Contains(t, out.String(), "charges ok: 30, failed: 0")
		assert.Contains(t, out.String(), "charges executed more than once: 0")
	}
}
