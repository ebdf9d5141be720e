package idemhttp

import "github.com/idemkit/idemhttp/internal/contract"

// KeyDigest returns the digest by which log records name an idempotency
// key (key_digest): the first 12 hex digits of the SHA-256 of the key as
// sent. The client's Logger and the server's (idemserver, TxMiddleware)
// write the same digest, so that an operator handed a key finds its
// records on both sides without the logs holding the key itself; in a
// shell, printf %s "$KEY" | sha256sum | cut -c1-12. A digest hides a key
// that is hard to guess (a minted one), not one that is easy to guess.
func KeyDigest(key string) string { return contract.KeyDigest(key) }
