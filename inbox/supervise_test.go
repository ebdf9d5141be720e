package inbox_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/inbox"
)

// Past the limit, a handler that still runs has its context ended and its
// message released, once; Supervise waits for it and says so. (With
// Release not called at the limit, the handler waited for ever: this test
// failed by its deadline.)
func TestSuperviseReleasesAtTheLimit(t *testing.T) {
	releasedC := make(chan struct{})
	var releases atomic.Int32
	h := func(ctx context.Context, _ *inbox.Message) error {
		<-releasedC // a handler that ignores its context until the message is gone
		assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded, "its context ended at the limit")
		return nil
	}
	released, err := inbox.Supervise(context.Background(), h, &inbox.Message{}, inbox.Supervision{
		Limit:   10 * time.Millisecond,
		Release: func() { releases.Add(1); close(releasedC) },
	})
	require.NoError(t, err, "the handler's own result")
	assert.True(t, released)
	assert.Equal(t, int32(1), releases.Load())
}

// A handler that returns in time is never released.
func TestSuperviseInTime(t *testing.T) {
	boom := errors.New("boom")
	var releases atomic.Int32
	released, err := inbox.Supervise(context.Background(), func(context.Context, *inbox.Message) error { return boom },
		&inbox.Message{}, inbox.Supervision{Limit: time.Hour, Release: func() { releases.Add(1) }})
	assert.ErrorIs(t, err, boom)
	assert.False(t, released)
	assert.Zero(t, releases.Load())
}

// Beats come every interval while the handler runs, and stop when it
// returns (goleak checks that the goroutine ended).
func TestSuperviseBeats(t *testing.T) {
	beats := make(chan struct{}, 10)
	h := func(context.Context, *inbox.Message) error {
		for range 3 {
			<-beats
		}
		return nil
	}
	released, err := inbox.Supervise(context.Background(), h, &inbox.Message{}, inbox.Supervision{
		Every: time.Millisecond,
		Beat: func() {
			select {
			case beats <- struct{}{}:
			default:
			}
		},
	})
	require.NoError(t, err)
	assert.False(t, released)
}

// A context that ends (a shutdown) does not release the message: the
// handler returns, and the caller settles it.
func TestSuperviseShutdownDoesNotRelease(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var releases atomic.Int32
	h := func(ctx context.Context, _ *inbox.Message) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}
	released, err := inbox.Supervise(ctx, h, &inbox.Message{}, inbox.Supervision{Limit: time.Hour, Release: func() { releases.Add(1) }})
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, released)
	assert.Zero(t, releases.Load())
}

// With nothing to watch, the handler runs as it is.
func TestSuperviseNothing(t *testing.T) {
	var ran bool
	released, err := inbox.Supervise(context.Background(), func(ctx context.Context, _ *inbox.Message) error {
		_, has := ctx.Deadline()
		assert.False(t, has)
		ran = true
		return nil
	}, &inbox.Message{}, inbox.Supervision{Every: time.Second}) // no Beat: no beats
	require.NoError(t, err)
	assert.False(t, released)
	assert.True(t, ran)
}

// A handler that outlives both a shutdown and its limit is released at
// the limit all the same. (Without the late release, it waited for ever:
// this test failed by its deadline.)
func TestSuperviseShutdownThenLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	releasedC := make(chan struct{})
	released, err := inbox.Supervise(ctx, func(context.Context, *inbox.Message) error {
		<-releasedC
		return nil
	}, &inbox.Message{}, inbox.Supervision{Limit: 20 * time.Millisecond, Release: func() { close(releasedC) }})
	require.NoError(t, err)
	assert.True(t, released)
}
