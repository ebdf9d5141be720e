package idemserver

import (
	"fmt"
	"strconv"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/contract"
)

// KeyForm says which forms of the key header a server accepts.
type KeyForm int

// The key header forms. Either way the key itself must pass
// the key rules: 1 to 255 bytes of printable ASCII, no double
// quote, no leading or trailing space.
const (
	// KeyFormAny accepts both the bare form (Stripe: Idempotency-Key: abc)
	// and the IETF draft's quoted structured-field string
	// (Idempotency-Key: "abc"); both name the same key.
	KeyFormAny KeyForm = iota
	// KeyFormBare accepts only the bare form; a quoted value is refused.
	KeyFormBare
	// KeyFormQuoted accepts only the quoted form; a bare value is refused.
	KeyFormQuoted
)

// String returns the form's name.
func (f KeyForm) String() string {
	switch f {
	case KeyFormAny:
		return "any"
	case KeyFormBare:
		return "bare"
	case KeyFormQuoted:
		return "quoted"
	}
	return "KeyForm(" + strconv.Itoa(int(f)) + ")"
}

// parseKey returns the key in the header value v, accepting the forms that
// form allows. Errors wrap [idemhttp.ErrInvalidKey].
func parseKey(v string, form KeyForm) (string, error) {
	quoted := len(v) > 0 && v[0] == '"'
	switch {
	case form == KeyFormBare && quoted:
		return "", fmt.Errorf("idemserver: %w: quoted key; this server takes the bare form", idemhttp.ErrInvalidKey)
	case form == KeyFormQuoted && !quoted:
		return "", fmt.Errorf("idemserver: %w: bare key; this server takes the quoted form (\"key\")", idemhttp.ErrInvalidKey)
	}
	return contract.ParseKeyHeader(v)
}

// scopedKey joins a principal's scope and an idempotency key into one store
// key. The length prefix makes the join unambiguous for any scope, so no
// tenant can pick a scope or key that collides with another's.
func scopedKey(scope, key string) string {
	b := make([]byte, 0, 24+len(scope)+len(key))
	b = strconv.AppendInt(b, int64(len(scope)), 10)
	b = append(b, ':')
	b = append(b, scope...)
	b = append(b, ':')
	b = append(b, key...)
	return string(b)
}
