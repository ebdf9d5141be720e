//go:build !idemhttp_bug_newkey

package plant

// RetryNewKey, with the idemhttp_bug_newkey build tag: every retry is sent
// under a key of its own ([RetryKey]), as a client that mints a key per
// attempt instead of per operation does.
const RetryNewKey = false
