//go:build idemhttp_bug_newkey

package idemhttp

import (
	"net/http"
	"strconv"
)

// bugRetryNewKey: this build sends every retry under a new key (see
// bug_newkey_off.go). It exists only so the simulator can show it finds
// the bug; never ship it.
const bugRetryNewKey = true

// bugMintRetryKey gives the retry r of a a key of its own, derived from
// the call's, so that runs stay reproducible.
func bugMintRetryKey(a *operation, r *http.Request) {
	r.Header[a.p.keyHeader] = []string{a.key + "-retry-" + strconv.Itoa(a.attempts)}
}
