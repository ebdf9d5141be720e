package postgres

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/idemkit/idemhttp/idemserver"
)

// maxRowKey is the longest key stored as it is in idemhttp_keys. A btree
// entry must fit in a third of a page (about 2700 bytes), and the store key
// is the principal's scope joined to a key of up to 255 bytes, so a long
// scope could otherwise make a key that can never be stored: a permanent
// 503 for that client. 200 bytes keeps the index small as well.
const maxRowKey = 200

// hashedPrefix starts every hashed row key.
const hashedPrefix = "sha256:"

// rowKey returns the idemhttp_keys primary key for a store key: the key
// itself, or "sha256:" and the hex SHA-256 of the key when it is longer
// than maxRowKey bytes or itself starts with "sha256:". Hashing the latter
// too keeps the mapping one-to-one: a key stored as it is never starts
// with the prefix, so it cannot equal another key's hash.
func rowKey(key string) []byte {
	if len(key) <= maxRowKey && !strings.HasPrefix(key, hashedPrefix) {
		return []byte(key)
	}
	sum := sha256.Sum256([]byte(key))
	b := make([]byte, 0, len(hashedPrefix)+hex.EncodedLen(len(sum)))
	b = append(b, hashedPrefix...)
	return hex.AppendEncode(b, sum[:])
}

// scopedRowKey is rowKey(idemserver.ScopedKey(scope, key)) in one
// allocation, for the middleware's every request. (A scoped key starts
// with a digit, never with the hashed prefix.)
func scopedRowKey(scope, key string) []byte {
	n := len(scope) + len(key) + 22
	if n > maxRowKey+22 {
		return rowKey(idemserver.ScopedKey(scope, key))
	}
	b := make([]byte, 0, n)
	b = strconv.AppendInt(b, int64(len(scope)), 10)
	b = append(b, ':')
	b = append(b, scope...)
	b = append(b, ':')
	b = append(b, key...)
	if len(b) > maxRowKey {
		return rowKey(string(b))
	}
	return b
}
