package idemserver

import (
	"log/slog"

	"github.com/idemkit/idemhttp/internal/contract"
)

// KeyDigest returns the digest by which the middleware's log records name
// an idempotency key (the key_digest attribute), so that an operator
// handed a key can find its lines: the first 12 hex digits of the SHA-256
// of the key, as the client sent it (without the header's quotes, and not
// scoped by the principal: the same key of two tenants has one digest).
// A shell computes it too:
//
//	printf %s "$KEY" | sha256sum | cut -c1-12
//
// The digest stands in for the key because a key names an operation whose
// stored response it can fetch (see [Hooks.RecordKey], which lets the key
// itself into the log). It hides a key that is hard to guess, as minted
// keys are; a key named after its order ("order-42") anyone can hash and
// find.
func KeyDigest(key string) string { return contract.KeyDigest(key) }

// logKey returns the attribute a log record names key by: its digest, and
// the key too with Hooks.RecordKey.
func (h *handler) logKey(key string) slog.Attr { return contract.LogKey(key, h.logKeys) }
