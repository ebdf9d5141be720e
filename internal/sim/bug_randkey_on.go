//go:build go1.26 && idemhttp_bug_randkey

package sim

// bugRandKey: keys the client mints come from crypto/rand (see
// bug_randkey_off.go).
const bugRandKey = true
