package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"strings"
)

// KeyDigestLen is the length of a [KeyDigest], in hex digits: 48 bits,
// enough that two keys of one day's logs share a digest with odds of
// about one in 2^48 / keys.
const KeyDigestLen = 12

// KeyDigest returns the name a log record gives an idempotency key in its
// place: the first [KeyDigestLen] hex digits of the SHA-256 of the key's
// bytes, as the client sent it (unscoped, after the header's quotes are
// removed). The same key always gets the same digest, on the client and
// on the server, whatever the tenant; an operator computes it from a key
// with sha256sum as well:
//
//	printf %s "$KEY" | sha256sum | cut -c1-12
//
// A digest hides a key that is hard to guess (a minted one); one that is
// easy to guess ("order-42") it does not, since anyone can hash guesses.
func KeyDigest(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:KeyDigestLen/2])
}

// LogKey returns the attribute a log record names key by: key_digest (its
// [KeyDigest]) and, when raw is true (the server author or caller opted
// in), key itself too, inlined beside it (an attribute group with an
// empty name, which handlers inline).
func LogKey(key string, raw bool) slog.Attr {
	d := slog.String("key_digest", KeyDigest(key))
	if !raw {
		return d
	}
	return slog.Attr{Value: slog.GroupValue(d, slog.String("key", key))}
}

// RedactKey returns s, an error's text for a log record or a span, with
// every occurrence of key replaced by its digest ("key_digest:" and
// [KeyDigest]), unless raw (the caller opted in to keys in its logs):
// the journals and the client name the key in their errors, and a record
// that names the key by its digest must not carry it in its error.
func RedactKey(s, key string, raw bool) string {
	if raw || key == "" {
		return s
	}
	return strings.ReplaceAll(s, key, "key_digest:"+KeyDigest(key))
}
