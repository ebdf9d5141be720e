package idemhttp

import "github.com/idemkit/idemhttp/internal/wal"

// The byte-level format moved to internal/wal, and so did its tests;
// these names let the journal's replay and codec tests here build files
// by hand as before.
const (
	fjFileHdrLen  = wal.FileHeaderLen
	fjBatchHdrLen = wal.BatchHeaderLen
)

var (
	fjAppendRecord = wal.AppendRecord
	fjReadRecord   = wal.ReadRecord
	fjSealBatch    = wal.SealBatch
	fjFileHeader   = wal.FileHeader
	fjReadBatch    = wal.ReadBatch
	fjMagic        = wal.Magic
)
