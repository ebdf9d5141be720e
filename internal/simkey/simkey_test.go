package simkey_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/internal/simkey"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Off, a mint in the context is ignored, so that no program but the
// simulator's ever names a key it did not mean to; on, the context's mint
// names it, and a context without one leaves the client to mint its own.
// Checked to fail with Mint ignoring Enable.
func TestMint(t *testing.T) {
	ctx := simkey.With(context.Background(), func() string { return "k-1" })
	assert.Empty(t, simkey.Mint(ctx), "off: the client mints its own")
	simkey.Enable()
	assert.Equal(t, "k-1", simkey.Mint(ctx))
	assert.Empty(t, simkey.Mint(context.Background()), "no mint in the context")
}
