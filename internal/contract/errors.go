package contract

import "errors"

// The sentinels the rules report, re-exported by the root package as
// idemhttp.ErrInvalidKey and idemhttp.ErrInvalidRequest (the same values,
// so errors.Is matches them from either name).
var (
	ErrInvalidKey     = errors.New("invalid idempotency key")
	ErrInvalidRequest = errors.New("invalid request")
)
