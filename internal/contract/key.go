package contract

import (
	"fmt"
	"strings"
)

// KeyHeader is the header that carries the key unless a policy names
// another (Stripe, Adyen and the IETF Idempotency-Key draft all use it).
const KeyHeader = "Idempotency-Key"

// MaxKeyLen is the longest key accepted, in bytes (Stripe's limit, which
// the IETF draft leaves to the server).
const MaxKeyLen = 255

// ValidateKey reports whether key may be sent as an idempotency key: 1 to
// 255 bytes of printable ASCII (space through tilde), without a double
// quote, and without leading or trailing spaces, which HTTP strips from
// header values so that the server would see a different key. It takes a
// key held as a string or as bytes (a journal's replay, which would
// otherwise copy every key to check it). The error wraps [ErrInvalidKey].
func ValidateKey[T string | []byte](key T) error {
	if p := idProblem(key, "key"); p != "" {
		return fmt.Errorf("idemhttp: %w: %s", ErrInvalidKey, p)
	}
	return nil
}

// ValidateOperation applies the key rules to an operation id: it is
// stored and printed by tools, so it gets the same hygiene. The error
// wraps [ErrInvalidRequest] and names the operation id, not a key: the
// caller's mistake is in WithOperation (or Entry.Operation), and a
// message about an invalid idempotency key sends them looking at keys
// they never set.
func ValidateOperation(op string) error {
	if p := idProblem(op, "operation id"); p != "" {
		return fmt.Errorf("idemhttp: %w: invalid operation id: %s", ErrInvalidRequest, p)
	}
	return nil
}

// idProblem returns what breaks the key rules in id (a key, or an
// operation id, as noun names it), "" for nothing.
func idProblem[T string | []byte](id T, noun string) string {
	if len(id) == 0 {
		return "empty " + noun
	}
	if len(id) > MaxKeyLen {
		return fmt.Sprintf("%s is %d bytes, at most %d allowed", noun, len(id), MaxKeyLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c < 0x20 || c > 0x7e {
			return fmt.Sprintf("byte %#02x at offset %d is not printable ASCII", c, i)
		}
		if c == '"' {
			return fmt.Sprintf("double quote at offset %d", i)
		}
	}
	if id[0] == ' ' || id[len(id)-1] == ' ' {
		return "leading or trailing space"
	}
	return ""
}

// FormatKeyHeader returns the header value that carries key: the key
// itself, or, with quoted set, the IETF draft's structured-field string
// form ("key" with backslashes escaped). It does not validate key.
func FormatKeyHeader(key string, quoted bool) string {
	if !quoted {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '\\' || key[i] == '"' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}

// ParseKeyHeader returns the key carried by an Idempotency-Key header
// value in either form: bare (Stripe) or a quoted structured-field string
// (IETF draft). The key is validated with [ValidateKey]; a malformed
// quoted string or an invalid key gives an error wrapping
// [ErrInvalidKey].
func ParseKeyHeader(v string) (string, error) {
	if len(v) >= 1 && v[0] == '"' {
		if len(v) < 2 || v[len(v)-1] != '"' {
			return "", fmt.Errorf("idemhttp: %w: unterminated quoted key", ErrInvalidKey)
		}
		inner := v[1 : len(v)-1]
		if strings.IndexByte(inner, '\\') >= 0 || strings.IndexByte(inner, '"') >= 0 {
			var b strings.Builder
			for i := 0; i < len(inner); i++ {
				c := inner[i]
				if c == '"' {
					return "", fmt.Errorf("idemhttp: %w: unescaped quote inside quoted key", ErrInvalidKey)
				}
				if c == '\\' {
					i++
					if i == len(inner) || (inner[i] != '\\' && inner[i] != '"') {
						return "", fmt.Errorf("idemhttp: %w: bad escape in quoted key", ErrInvalidKey)
					}
					c = inner[i]
				}
				b.WriteByte(c)
			}
			inner = b.String()
		}
		v = inner
	}
	if err := ValidateKey(v); err != nil {
		return "", err
	}
	return v, nil
}
