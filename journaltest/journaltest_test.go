package journaltest_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/journaltest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestFileJournal runs the suite against the embedded journal, so that the
// suite itself is known to pass a correct implementation.
func TestFileJournal(t *testing.T) {
	journaltest.Run(t, func(t *testing.T) idemhttp.Journal {
		j, err := filejournal.Open(filepath.Join(t.TempDir(), "journal.db"), nil)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, j.Close()) })
		return j
	})
}
