package idemhttp

import "github.com/idemkit/idemhttp/internal/wal"

// The byte-level format moved to internal/wal; these names let the
// replay and codec tests here build files by hand as before.
const (
	fjFileHdrLen  = wal.FileHeaderLen
	fjBatchHdrLen = wal.BatchHeaderLen
	fjVersion     = wal.Version
	fjFindWindow  = wal.FindWindow
)

var (
	fjAppendRecord    = wal.AppendRecord
	fjReadRecord      = wal.ReadRecord
	fjSealBatch       = wal.SealBatch
	fjFileHeader      = wal.FileHeader
	fjReadBatch       = wal.ReadBatch
	fjMagic           = wal.Magic
	fjCheckFileHeader = wal.CheckFileHeader
	journalCRC        = wal.Checksum
)
