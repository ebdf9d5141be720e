// Package filejournal is idemhttp's embedded [idemhttp.Journal]: pending
// idempotency keys in one local file, so that a process that dies
// mid-request resends its operations with the same keys after a restart.
//
// It maps journal entries to the records of internal/wal, the byte-level
// log (checksummed batches, group commit, locking, replay, rewrite), which
// knows nothing of HTTP or of idemhttp's types. Open a journal with [Open]
// and give it to an [idemhttp.Client]:
//
//	j, err := filejournal.Open("payments.journal", nil)
//	if err != nil { ... }
//	defer j.Close()
//	c := &idemhttp.Client{Journal: j}
//
// The file's format is in docs/journal-format.md at the repository's root.
// The package's own tests cut power for real (loop-mounted ext4), kill
// processes mid-commit and fuzz the decoders; the journaltest package is
// the contract every Journal passes.
package filejournal
