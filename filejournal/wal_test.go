package filejournal

import (
	"bytes"

	"github.com/idemkit/idemhttp/internal/wal"
)

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

// replayed is a replay's index and what the log found.
type replayed struct {
	*index
	*wal.Replayed
}

// replay rebuilds the index from a journal file's bytes, header
// included, as Open does. With salvage, damage in the middle
// of the file is skipped instead of refused.
func replay(data []byte, salvage bool) (*replayed, error) {
	idx := newFjIndex()
	res, err := wal.ReplayDigest(bytes.NewReader(data), int64(len(data)), salvage, idx.applyRecord, digest)
	if err != nil {
		return nil, err
	}
	return &replayed{idx, res}, nil
}

// replayWith is replay applying records with apply, undigested.
func replayWith(data []byte, salvage bool, apply func(*index, int64, int, []byte) error) (*replayed, error) {
	idx := newFjIndex()
	res, err := wal.Replay(bytes.NewReader(data), int64(len(data)), salvage, func(off int64, n int, p []byte) error {
		return apply(idx, off, n, p)
	})
	if err != nil {
		return nil, err
	}
	return &replayed{idx, res}, nil
}
