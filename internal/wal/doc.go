// Package wal is the byte-level log under idemhttp's FileJournal: an
// append-only file of checksummed records, written in batches with group
// commit, locked against a second writer, replayed on open, and rewritten
// atomically. It knows nothing of what its records mean; the journal
// layer (package filejournal) maps entries to record payloads.
//
// The layout, and how damage is told from a torn write, is in
// docs/journal-format.md at the repository's root.
//
// The idemhttp_nosync build tag turns every sync off (the O_DSYNC flag,
// fdatasync and the directory sync): a control build for the power-loss
// test, which must show that such a build loses acknowledged entries.
package wal
