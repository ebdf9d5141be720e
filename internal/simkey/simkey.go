// Package simkey lets the simulator (internal/sim) name the keys a Client
// mints, so that a seeded world stays the same on every run: a key minted
// from crypto/rand would make every journal, trace and tie in an order
// differ from run to run. The simulator turns it on once ([Enable]) and
// puts a mint in each call's context ([With]); the client asks for a key
// with [Mint] before minting one of its own. Off (in every program but the
// simulator's test binary) it costs one atomic load per minted key.
package simkey

import (
	"context"
	"sync/atomic"
)

var on atomic.Bool

// Enable turns the hook on for the process.
func Enable() { on.Store(true) }

type ctxKey struct{}

// With returns a copy of ctx whose calls mint their keys with mint.
func With(ctx context.Context, mint func() string) context.Context {
	return context.WithValue(ctx, ctxKey{}, mint)
}

// Mint returns the key ctx's mint gives, or "" when the hook is off or
// ctx carries no mint: the client then mints its own.
func Mint(ctx context.Context) string {
	if !on.Load() {
		return ""
	}
	if f, ok := ctx.Value(ctxKey{}).(func() string); ok {
		return f()
	}
	return ""
}
