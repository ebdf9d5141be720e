//go:build !idemhttp_bug_getbodyrewind

package plant

// GetBodyRewind, with the idemhttp_bug_getbodyrewind build tag: a retry
// of a body the client holds in memory (every journaled call's) takes its
// bytes from the caller's GetBody again, as go-retryablehttp's rewind
// does, unchecked, instead of the bytes the first attempt sent: a GetBody
// that gives other bytes sends another request under the same key.
const GetBodyRewind = false
