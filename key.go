package idemhttp

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"

	"github.com/google/uuid"
)

// DefaultKeyHeader is the header that carries the idempotency key unless
// [Policy.KeyHeader] names another. Stripe, Adyen and the IETF
// Idempotency-Key draft all use this name.
const DefaultKeyHeader = "Idempotency-Key"

// MaxKeyLen is the longest key accepted, in bytes (Stripe's limit, which the
// IETF draft leaves to the server).
const MaxKeyLen = 255

// minSecretLen is the shortest secret DeriveKey accepts: HMAC-SHA256 keyed
// with fewer than 128 bits would let an outsider guess derived keys.
const minSecretLen = 16

// NewKey returns a fresh idempotency key: a random (version 4) UUID drawn
// from crypto/rand, in its 36-character canonical form.
//
// Mint the key once per logical operation, before the first attempt, and
// send it unchanged on every retry; a key minted after a failure cannot
// deduplicate anything. [Client.Do] does this by itself.
func NewKey() string {
	// Filled in place rather than with uuid.New, which costs an extra
	// allocation on every request. crypto/rand.Read never fails.
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	return u.String()
}

// DeriveKey returns the idempotency key for operation, derived from secret
// with HMAC-SHA256 and shaped as a version 8 UUID.
//
// The same secret and operation always give the same key, so a batch job
// that reruns after a crash sends the key it sent before even without a
// journal, and nobody without the secret can predict or forge a key. The
// secret must be at least 16 bytes and operation non-empty; otherwise the
// error wraps [ErrInvalidKey]. The secret itself never appears in the key.
func DeriveKey(secret []byte, operation string) (string, error) {
	if len(secret) < minSecretLen {
		return "", fmt.Errorf("idemhttp: derive key: %w: secret is %d bytes, need at least %d", ErrInvalidKey, len(secret), minSecretLen)
	}
	if operation == "" {
		return "", fmt.Errorf("idemhttp: derive key: %w: empty operation", ErrInvalidKey)
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(operation))
	var u uuid.UUID
	copy(u[:], m.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x80 // version 8: custom (RFC 9562 §5.8)
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10
	return u.String(), nil
}

type ctxKey int

const (
	keyCtxKey ctxKey = iota
	opCtxKey
	callCtxKey
)

// WithKey returns a copy of ctx that makes [Client.Do] send key as the
// idempotency key of a request made with it, instead of minting one. The key
// is validated when the request is sent. A request that also carries a
// different key in its header is refused with [ErrKeyConflict].
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtxKey, key)
}

// WithOperation returns a copy of ctx that names the logical operation a
// request performs (an order id, a batch line). With a [Journal], the client
// reuses the key it stored for that operation, so rerunning the operation
// after a crash sends the same key and the server replays instead of acting
// twice; the same operation with a different body is refused locally with
// [ErrKeyMismatch]. Without a journal the mapping lives in the client's
// memory for [Policy.Retention].
func WithOperation(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, opCtxKey, id)
}

func keyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtxKey).(string)
	return k, ok
}

func operationFromContext(ctx context.Context) (string, bool) {
	op, ok := ctx.Value(opCtxKey).(string)
	return op, ok
}
