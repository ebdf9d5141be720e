package filejournal

import "github.com/idemkit/idemhttp/internal/wal"

// Errors of the journal. They are the log engine's own values (internal/wal),
// so errors.Is matches them however deep the engine's error is wrapped.
var (
	// ErrLocked: another Journal (in this process or another)
	// has the journal file open for writing. Two writers would each
	// believe they own the pending keys, so the second open fails at once
	// instead of waiting. Inspection can open it
	// [Options.ReadOnly].
	ErrLocked = wal.ErrLocked

	// ErrCorrupt: the journal file or one of its entries is damaged
	// (overwritten, a failed disk, or damage before the marker of a clean
	// close). Nothing was guessed: restore the file from a backup, or
	// inspect and repair it ([Options.SkipVerify], idemctl verify
	// -repair).
	ErrCorrupt = wal.ErrCorrupt

	// ErrVersion: the journal file is in a format version this
	// build does not read, usually one written by a newer release. The
	// file is intact: open it with the release that wrote it.
	ErrVersion = wal.ErrVersion

	// ErrNotJournal: the file is not a journal at all (for example a
	// batch's input named where the journal was meant). Nothing in it was
	// changed.
	ErrNotJournal = wal.ErrNotJournal

	// ErrClosed: the Journal was closed.
	ErrClosed = wal.ErrClosed

	// ErrReadOnly: the Journal was opened
	// [Options.ReadOnly], and the call would write.
	ErrReadOnly = wal.ErrReadOnly

	// ErrReplaced: the journal file was deleted, or another file
	// renamed over its path, while it was open. Writes stop: they would go
	// to a file nobody opens again.
	ErrReplaced = wal.ErrReplaced
)
