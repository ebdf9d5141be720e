package idemhttp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWithAttempts(t *testing.T) {
	t.Run("fewer", func(t *testing.T) {
		srv := newScripted(t, reply(503, ""), reply(200, ""))
		c := &Client{Policy: fast()}
		req := post(t, srv.URL, chargeBody)
		_, err := c.Do(req.WithContext(WithAttempts(req.Context(), 1)))
		assert.ErrorIs(t, err, ErrExhausted)
		assert.Len(t, srv.Hits(), 1)

		// The next call without an override gets the policy's 4 attempts.
		resp, err := c.Do(post(t, srv.URL, chargeBody))
		require.NoError(t, err)
		resp.Body.Close()
	})
	t.Run("more", func(t *testing.T) {
		srv := newScripted(t, reply(503, ""), reply(503, ""), reply(503, ""), reply(503, ""), reply(503, ""), reply(200, ""))
		c := &Client{Policy: fast()}
		req := post(t, srv.URL, chargeBody)
		resp, err := c.Do(req.WithContext(WithAttempts(req.Context(), 6)))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Len(t, srv.Hits(), 6)
	})
	t.Run("below one means one", func(t *testing.T) {
		srv := newScripted(t, reply(503, ""))
		c := &Client{Policy: fast()}
		req := post(t, srv.URL, chargeBody)
		_, err := c.Do(req.WithContext(WithAttempts(req.Context(), -3)))
		assert.ErrorIs(t, err, ErrExhausted)
		assert.Len(t, srv.Hits(), 1)
	})
}

func TestWithInProgressPatience(t *testing.T) {
	inProgress := reply(409, `{"type":"https://idemkit.dev/problems/idempotency-in-progress"}`, "Retry-After", "0", "Content-Type", "application/problem+json")
	t.Run("zero stops at the first 409", func(t *testing.T) {
		srv := newScripted(t, drop, inProgress, reply(200, ""))
		c := &Client{Policy: fast()}
		req := post(t, srv.URL, chargeBody)
		_, err := c.Do(req.WithContext(WithInProgressPatience(req.Context(), 0)))
		assert.ErrorIs(t, err, ErrInProgress)
		assert.Len(t, srv.Hits(), 2)
	})
	t.Run("combined with WithAttempts, both apply", func(t *testing.T) {
		srv := newScripted(t, drop, inProgress, inProgress, reply(200, ""))
		c := &Client{Policy: &Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, InProgressPatience: time.Nanosecond}}
		ctx := WithInProgressPatience(WithAttempts(context.Background(), 2), time.Minute)
		resp, err := c.Do(post(t, srv.URL, chargeBody).WithContext(ctx))
		require.NoError(t, err, "in-progress waits are not counted against the 2 attempts, and the minute of patience wins over the policy's nanosecond")
		resp.Body.Close()
		assert.Len(t, srv.Hits(), 4)
	})
}
