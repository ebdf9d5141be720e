//go:build !idemhttp_bug_newkey

package idemhttp

import "net/http"

// bugRetryNewKey is a planted bug for the simulator (internal/sim) to
// find: with the idemhttp_bug_newkey build tag, every retry is sent under
// a key of its own, as a client that mints a key per attempt instead of
// per operation does. Never ship that build.
const bugRetryNewKey = false

func bugMintRetryKey(*operation, *http.Request) {}
