package filejournal

import "github.com/idemkit/idemhttp/internal/wal"

// The byte-level format moved to internal/wal, and so did its tests;
// these names let the journal's replay and codec tests here build files
// by hand as before.
const (
	fileHdrLen  = wal.FileHeaderLen
	batchHdrLen = wal.BatchHeaderLen
)

var (
	appendRecord = wal.AppendRecord
	readRecord   = wal.ReadRecord
	sealBatch    = wal.SealBatch
	fileHeader   = wal.FileHeader
	readBatch    = wal.ReadBatch
	magic        = wal.Magic
)
