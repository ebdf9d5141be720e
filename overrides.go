package idemhttp

import (
	"context"
	"time"
)

// overrides are per-call changes to a Client's policy, carried by the
// request's context.
type overrides struct {
	attempts    int           // 0: the policy's
	hasPatience bool          // patience is set
	patience    time.Duration // the in-progress patience
}

type overridesKey struct{}

func overridesFrom(ctx context.Context) (overrides, bool) {
	o, ok := ctx.Value(overridesKey{}).(*overrides)
	if !ok {
		return overrides{}, false
	}
	return *o, true
}

// WithAttempts returns a copy of ctx that makes [Client.Do] make at most n
// attempts (the first included) for a request made with it, instead of
// [Policy.MaxAttempts]. n < 1 means 1: no retries. Everything else about
// the policy is unchanged, and retries after a 409 in progress still do
// not count against n.
func WithAttempts(ctx context.Context, n int) context.Context {
	o, _ := overridesFrom(ctx)
	o.attempts = max(n, 1)
	return context.WithValue(ctx, overridesKey{}, &o)
}

// WithInProgressPatience returns a copy of ctx that makes [Client.Do] wait
// out a 409 in progress for at most d for a request made with it, instead
// of [Policy.InProgressPatience]. d <= 0 means no waiting: the first 409 in
// progress stops the call with [ErrInProgress]. The context's deadline
// still bounds the wait.
func WithInProgressPatience(ctx context.Context, d time.Duration) context.Context {
	o, _ := overridesFrom(ctx)
	o.hasPatience, o.patience = true, max(d, 0)
	return context.WithValue(ctx, overridesKey{}, &o)
}

// apply returns p with the call's overrides, as a copy; p itself when
// the context carries none.
func (p *policy) apply(ctx context.Context) *policy {
	o, ok := overridesFrom(ctx)
	if !ok {
		return p
	}
	cp := *p
	if o.attempts > 0 {
		cp.maxAttempts = o.attempts
	}
	if o.hasPatience {
		cp.inProgressPatience = o.patience
	}
	return &cp
}
