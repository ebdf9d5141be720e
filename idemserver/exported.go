package idemserver

import (
	"net/http"

	"github.com/idemkit/idemhttp/internal/servercore"
)

// The functions in this file expose the middleware's own request rules to
// other middleware that must apply them exactly as [Middleware] does, such
// as the transactional middleware of idemhttp's PostgreSQL module: the same
// key syntax, the same fingerprint, the same store key and the same
// problems, so that a client sees one contract whichever middleware serves
// it.

// ErrBodyTooLarge is returned by [ReadBody] for a request body over its
// limit.
var ErrBodyTooLarge = errTooLarge

// ParseKey returns the idempotency key in the key header value v,
// accepting the forms that form allows, as [Middleware] does. Errors wrap
// [idemhttp.ErrInvalidKey] and their text suits a [Problem]'s detail.
func ParseKey(v string, form KeyForm) (string, error) { return parseKey(v, form) }

// ReadBody reads a request's whole body, refusing with [ErrBodyTooLarge]
// more than limit bytes, as [Middleware] does before fingerprinting.
func ReadBody(r *http.Request, limit int64) ([]byte, error) { return readBody(r, limit) }

// ScopedKey returns the store key under which [Middleware] keeps the
// record of key for a principal's scope: the two joined unambiguously,
// so no scope and key can collide with another's.
func ScopedKey(scope, key string) string { return scopedKey(scope, key) }

// ProblemKeyMissing returns the problem answered to a request without the
// key header named header ([TypeKeyMissing], 400).
func ProblemKeyMissing(header string) *Problem { return problemKeyMissing(header) }

// ProblemKeyInvalid returns the problem answered to a request whose key
// header is malformed ([TypeKeyInvalid], 400); detail says how.
func ProblemKeyInvalid(header, detail string) *Problem { return problemKeyInvalid(header, detail) }

// ProblemKeyMismatch returns the problem answered when key was first used
// with a different request ([TypeKeyMismatch], 422).
func ProblemKeyMismatch(header, key string) *Problem { return problemKeyMismatch(header, key) }

// ProblemInProgress returns the problem answered while another request
// with key is running ([TypeInProgress], 409); the caller sets
// Retry-After.
func ProblemInProgress(header, key string) *Problem { return problemInProgress(header, key) }

// ProblemBodyTooLarge returns the problem answered to a request body over
// limit bytes ([TypeBodyTooLarge], 413).
func ProblemBodyTooLarge(limit int64) *Problem { return problemBodyTooLarge(limit) }

// ProblemBodyUnreadable returns the problem answered when the request body
// could not be read ([TypeBodyUnreadable], 400).
func ProblemBodyUnreadable() *Problem { return problemBodyUnreadable() }

// ProblemStoreUnavailable returns the problem answered when the store
// cannot say what became of key ([TypeStoreUnavailable], 503); the caller
// sets Retry-After.
func ProblemStoreUnavailable(key string) *Problem { return problemStoreUnavailable(key) }

// ProblemNoPrincipal returns the problem answered to a keyed request for
// which the Principal returned an empty scope ([TypeNoPrincipal], 500).
func ProblemNoPrincipal() *Problem { return problemNoPrincipal() }

// ErrResponseNotKept is returned (wrapped) by [Response.UnmarshalBinary]
// for the record of a request that ran but whose response was not kept
// (see [NotReplayableRecord]): a retry must be answered 410
// ([ProblemNotReplayable]), never run.
var ErrResponseNotKept = servercore.ErrNotReplayable

// NotReplayableRecord returns the record that marks a key as completed by
// a request that ran but whose response cannot be replayed: too large to
// store, sent on a hijacked connection, or (in a transactional
// middleware) committed by the handler outside the middleware's
// transaction. status is the handler's, or 0 if unknown. A retry of the
// key gets 410 ([TypeNotReplayable]) for as long as the record is kept.
func NotReplayableRecord(status int) []byte { return servercore.Unreplayable(status) }

// ProblemNotReplayable returns the problem answered for a key whose
// record is a [NotReplayableRecord] ([TypeNotReplayable], 410); status is
// the record's.
func ProblemNotReplayable(header, key string, status int) *Problem {
	return problemNotReplayable(header, key, status)
}
