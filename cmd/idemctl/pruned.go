package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
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

// readPruned returns the record at path by operation id (the latest
// record of each); a missing file is an empty record. A torn last line
// (a crash during the append) is ignored: prune deletes nothing until the
// append is synced, so those entries are still in the journal. Damage
// anywhere else is an error.
func readPruned(path string) (map[string]prunedRecord, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(data, '\n'); i != len(data)-1 {
		data = data[:i+1] // the torn tail, or the whole file if it has no line end
	}
	out := make(map[string]prunedRecord)
	for n, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r prunedRecord
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n+1, err)
		}
		if r.Operation != "" {
			out[r.Operation] = r
		}
	}
	return out, nil
}
