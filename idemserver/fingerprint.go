package idemserver

import (
	"net/http"

	"github.com/idemkit/idemhttp/internal/fingerprint"
)

// DefaultFingerprint is the default [Middleware].Fingerprint. It identifies
// a request by meaning, as Stripe compares a retry's parameters with the
// first request's, so that a client library that re-encodes the same
// request differently on a retry is not refused with 422, while two
// requests a Go handler would tell apart never share a fingerprint:
//
//   - method and escaped path, byte for byte, but not the Host: a retry
//     may reach another instance of the service under another name (a
//     client balancing by address, a failover to another region's
//     endpoint) and is still the same request. Services that must not
//     share keys keep them apart in the store (a Redis Prefix, a
//     PostgreSQL schema each), not by host name;
//   - query parameters sorted by name (the values of one name keep their
//     order) and decoded, so ?b=2&a=1 and ?a=1&b=2 are one query;
//   - a JSON body (Content-Type application/json or any +json type) in a
//     canonical form: whitespace and string escapes ignored, numbers kept
//     as their literal text (1.0 and 1 differ), object members sorted by
//     name as encoding/json matches names: without regard to letter case
//     (Unicode simple folding), members whose names are equal that way
//     keeping their order, since the last of them wins. So {"a":1,"b":2}
//     and {"b":2,"a":1} are one request, and {"Amount":1,"amount":1000}
//     and {"amount":1000,"Amount":1} two;
//   - a form body (application/x-www-form-urlencoded) with its fields
//     sorted as the query's are, when it reads as a form: a body holding a
//     double quote, a brace, a backslash, whitespace, a control or a
//     non-ASCII byte, which no form encoder writes unescaped (a JSON body
//     sent with a form type, say), is compared byte for byte, not split at
//     its ampersands;
//   - any other body, and a JSON or form body that does not parse, byte for
//     byte;
//   - the Content-Type's media type and its parameters (a multipart
//     boundary, a charset), which change what a handler reads from the
//     same bytes: letter case ignored where it means nothing (names, the
//     media type, a charset's value), parameters in any order, and
//     charset=utf-8 ignored for JSON, whose only encoding it is.
//
// It returns the hex SHA-256 of those parts. A JSON body holding invalid
// UTF-8 or an unpaired surrogate escape, or nesting deeper than 1000, is
// compared byte for byte rather than guessed at: when in doubt two requests
// differ (a 422), never the other way (a replay of another request's
// response). Its cost is linear in the body, whatever its nesting.
//
// Records stored by earlier releases hold the fingerprints those releases
// computed; a [Middleware] with a nil Fingerprint accepts them too, for
// their TTL, so that an upgrade does not turn their retries into 422s
// (docs/server.md, "Formats and upgrades").
func DefaultFingerprint(r *http.Request, body []byte) string {
	return fingerprint.Current(r, body)
}

// PreviousFingerprint is the DefaultFingerprint of the release before
// this one (fingerprint version 1, commit 2d053bb): JSON members sorted by
// their bytes, any body that parses as a form split into fields, and the
// Content-Type not compared. It is for rolling deploys: set it as
// [Middleware].Fingerprint (and TxMiddleware's) while instances of that
// release serve the same keys, so that every instance stores and compares
// the fingerprints that release does, and a retry that moves between
// instances of the two releases is replayed rather than refused with 422;
// remove it once none does. (Records stored meanwhile are accepted by the
// default afterwards, as every earlier version's are.)
func PreviousFingerprint(r *http.Request, body []byte) string {
	return fingerprint.V1(r, body)
}
