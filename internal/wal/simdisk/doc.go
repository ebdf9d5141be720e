// Package simdisk is a simulated disk for the journal's log: an
// in-memory [wal.FS] on which a write reaches a cache and only a sync
// makes it durable, a directory's changes (create, rename, remove) are
// durable only once the directory is synced, and a crash keeps what was
// synced and, as configured, a prefix of what was not (a torn last
// write, at sector or byte granularity). Calls fail by a deterministic
// [Fault] (ENOSPC or EIO on write and on sync, or any error on any
// call), and the power can be cut at any call. It is deterministic and
// runs no goroutine, so the same calls and random source give the same
// disk: for the log's crash tests and for the simulator of the whole
// system. What it models and what it does not is in internal/wal's
// package doc.
package simdisk
