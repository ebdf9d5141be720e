// Package wal is the byte-level log under package filejournal, the embedded journal: an
// append-only file of checksummed records, written in batches with group
// commit, locked against a second writer, replayed on open, and rewritten
// atomically. It knows nothing of what its records mean; the journal
// layer (package filejournal) maps entries to record payloads.
//
// The layout, and how damage is told from a torn write, is in
// docs/journal-format.md at the repository's root.
//
// # The file-system seam
//
// Every file access of the log goes through one small interface, [FS]
// with its [File]: open with flags (and O_DSYNC, asked for with dsync),
// reads and writes at offsets, truncation, stat and file identity,
// rename, remove, the writer's and the viewers' locks, fdatasync, the
// directory sync, the write-back hint and the freeing of a replaced
// file. [Options.FS] chooses it; nil is [OS], the operating system's,
// which is the code the log always ran. The simulated disk of
// internal/wal/simdisk is the other, for crash and fault tests.
//
// The idemhttp_nosync build tag turns every sync of the log off (the
// O_DSYNC flag, SyncData, the directory sync, WriteBack), above the
// seam, whatever the FS: a control build for the power-loss test, which
// must show that such a build loses acknowledged entries.
//
// # What the simulated disk models
//
// simdisk.Disk holds files in memory, each with durable contents and a
// cache. A write reaches the cache; SyncData makes every change of the
// file durable; a write through a file opened with dsync makes the whole
// file durable before it returns (Linux's O_DSYNC promises only the
// range written: the simulation is the stronger). A failed sync drops
// what it would have made durable, for good, though reads still see it
// (Linux marks the pages clean after an I/O error): a later sync that
// succeeds does not bring it back. Directory entries (create, rename,
// remove) become durable only when their directory is synced; a rename
// within a directory is atomic. A crash ([simdisk.Disk.Crash], with a
// seeded random source) keeps what is durable, never reorders it, and,
// as configured, a prefix of each file's unsynced writes and
// truncations, in the order they were made, the last write torn at a
// 512-byte sector or at any byte; and a prefix of the directory changes
// made since their directories were synced, in order across directories
// (a file system with an ordered metadata journal). The power can be cut
// at any call that changes the disk (HaltAt: the write cut reaches the
// cache in part), a process killed with its cache kept (Kill), and any
// call failed by a deterministic Fault (ENOSPC and EIO on write and sync
// among them). It counts directory syncs per directory. It runs no
// goroutine, reads no clock and depends on no map order: the same calls
// and seed give the same disk.
//
// # What it does not
//
// Unsynced writes of one file are kept only as a prefix, in order: the
// disk never keeps a later write and drops an earlier one of the same
// file (it does across files: each file's prefix is drawn on its own).
// A torn write keeps a prefix of its bytes and never leaves garbage: no
// torn sector of random bytes, no file whose size grew over blocks never
// written (zeros, or stale data, as XFS and ext4's writeback mode may
// show), no bit rot, lost or misdirected synced writes; the format's
// checksums against those are tested by replay's fuzz test and the
// damage tests. A SyncData never makes a new file's directory entry
// durable (ext4 in practice does: the simulation is the stricter).
// Every directory exists; there are no symlinks, permissions, space
// accounting (ENOSPC comes only from a Fault), timestamps or write-back
// (WriteBack does nothing). Calls are serialized: none interleaves with
// another. The power-cut test on real ext4 (the root package's
// TestPowerCut) stays the test of the OS implementation.
package wal
