package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/internal/testenv"
)

// TestMain doubles as the consumer process: run re-executes the test
// binary, as the command re-executes itself, with the child's environment.
func TestMain(m *testing.M) {
	testenv.Main(m, envSeeds, func() int {
		return child(os.Getenv(envSeeds), os.Getenv(envDB), os.Getenv(envKillAfter))
	})
}

func TestKilledConsumerAppliesEachOrderOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns child processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := run(ctx, os.Args[0], &out)
	require.NoError(t, err, out.String())
	t.Log("\n" + out.String())

	assert.Equal(t, kills, rep.Kills)
	assert.Equal(t, orders+producerDups, rep.ProducerWrites)
	assert.Equal(t, orders, rep.InboxRows, "one ledger row per order, through kills and producer retries")
	assert.Equal(t, orders, rep.InboxOrders)
	assert.True(t, rep.ok())
	assert.Equal(t, orders, rep.NaiveOrders)
	assert.Greater(t, rep.NaiveRows, orders+producerDups, "the naive consumer repeats work after each kill")
}
