package wal

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hookFS is OS with OpenFile replaced: for a test that needs one open to
// fail, or to name another file than the path does.
type hookFS struct {
	OS
	open func(name string, flag int, perm os.FileMode, dsync bool) (File, error)
}

func (h hookFS) OpenFile(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
	return h.open(name, flag, perm, dsync)
}

// CreateNew tries the names in order and takes the first that is free,
// stops at an error other than the file existing, and gives up after
// 100 names. (With the loop going on after an error other than
// os.ErrExist, "other error stops" fails.)
func TestCreateNew(t *testing.T) {
	errDisk := errors.New("disk on fire")
	tests := []struct {
		name     string
		give     map[string]error // the error opening each name gives; nil: it is free
		wantName string
		wantErr  error
		wantN    int // names asked for
	}{
		{name: "first free", give: map[string]error{"f0": nil}, wantName: "f0", wantN: 1},
		{name: "third free", give: map[string]error{"f0": os.ErrExist, "f1": os.ErrExist, "f2": nil, "f3": nil}, wantName: "f2", wantN: 3},
		{name: "other error stops", give: map[string]error{"f0": os.ErrExist, "f1": errDisk, "f2": nil}, wantErr: errDisk, wantN: 2},
		{name: "all exist", give: nil, wantErr: os.ErrExist, wantN: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			fs := hookFS{open: func(name string, flag int, perm os.FileMode, dsync bool) (File, error) {
				err, ok := tt.give[filepath.Base(name)]
				if !ok {
					err = os.ErrExist
				}
				if err != nil {
					return nil, &os.PathError{Op: "open", Path: name, Err: err}
				}
				assert.Equal(t, os.O_WRONLY|os.O_CREATE|os.O_EXCL, flag)
				assert.Equal(t, os.FileMode(0o600), perm)
				return OS{}.OpenFile(name, flag, perm, dsync)
			}}
			var asked []int
			f, name, err := CreateNew(fs, func(i int) string {
				asked = append(asked, i)
				return filepath.Join(dir, "f"+strconv.Itoa(i))
			})
			assert.Len(t, asked, tt.wantN)
			for i, a := range asked {
				assert.Equal(t, i, a, "names tried in order")
			}
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr)
				assert.Nil(t, f)
				assert.Empty(t, name)
				return
			}
			require.NoError(t, err)
			assert.NoError(t, f.Close())
			assert.Equal(t, filepath.Join(dir, tt.wantName), name)
		})
	}
}
