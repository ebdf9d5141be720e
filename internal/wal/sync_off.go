//go:build idemhttp_nosync

package wal

// syncDisabled: this build never syncs. It exists only so the power-loss
// test can show that it bites; never ship it.
const syncDisabled = true
