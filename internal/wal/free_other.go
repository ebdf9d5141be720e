//go:build !linux

package wal

import "os"

// lockViewer is a no-op without open-file-description locks: writers
// then never free a replaced file early.
func lockViewer(*os.File) error { return nil }

// freeReplaced closes old, the file a rewrite replaced; the kernel frees
// it with the last close.
func freeReplaced(old *os.File) { _ = old.Close() }
