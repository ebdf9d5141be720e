package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idemhttp"
)

// prunedSuffix names the record of pruned operations, beside the journal.
//
// Why a file of its own and not a marker in the journal: a marker per
// pruned operation would stay in the journal's index forever, which is
// what pruning exists to bound (the journal keeps every live entry in
// memory); the journal's format belongs to the library, which knows
// nothing of batch inputs; and the record must outlive a journal rebuilt
// by verify -repair. Batch reads it once, at the start, for the ids of
// its input only.
const prunedSuffix = ".pruned"

// prunedRecord is one line of the record: an entry prune deleted. The
// field names are those of every other JSON output of idemctl.
type prunedRecord struct {
	Operation string         `json:"operation,omitempty"`
	Key       string         `json:"key"`
	State     idemhttp.State `json:"state"`
	Status    int            `json:"status,omitempty"`
	Updated   time.Time      `json:"updated"`
	Pruned    time.Time      `json:"pruned"`
}

// appendPruned appends records for entries to the record file at path and
// syncs it. Prune calls it before deleting anything: if the record cannot
// be made durable, nothing is pruned, so no operation is ever forgotten
// by both the journal and the record.
func appendPruned(path string, entries []*idemhttp.Entry, now time.Time) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for _, en := range entries {
		if err := enc.Encode(prunedRecord{
			Operation: en.Operation, Key: en.Key, State: en.State, Status: en.LastStatus,
			Updated: en.Updated, Pruned: now,
		}); err != nil {
			return err
		}
	}
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(buf.Bytes())
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil && errors.Is(statErr, fs.ErrNotExist) {
		werr = syncDir(filepath.Dir(path))
	}
	return werr
}

// readPruned returns the records at path of the operations want selects
// (nil: all), by operation id, the latest record of each; a missing file
// is an empty record. It streams the file and keeps only what want
// selects, so a record grown over many prunes costs a batch the memory of
// its own input only. A torn last line (a crash during the append) is
// ignored: prune deletes nothing until the append is synced, so those
// entries are still in the journal. Damage anywhere else is an error.
func readPruned(path string, want func(operation string) bool) (map[string]prunedRecord, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make(map[string]prunedRecord)
	br := bufio.NewReaderSize(f, 64<<10)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return out, nil // a last line without its end is torn: ignored
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r prunedRecord
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
		if r.Operation != "" && (want == nil || want(r.Operation)) {
			out[r.Operation] = r
		}
	}
}
