//go:build idemhttp_bug_opensettle

package wal

// bugOpenSettle: this build has the bug (see bug_opensettle_off.go).
const bugOpenSettle = true
