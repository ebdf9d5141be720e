package idemhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// keyErrJournal fails Finish and Delete with errors that name the key,
// as filejournal's ("idemhttp: journal finish <key>: ...") and
// contrib/postgres's do.
type keyErrJournal struct{ *recJournal }

func (k keyErrJournal) Finish(_ context.Context, key string, _ Outcome) error {
	return fmt.Errorf("idemhttp: journal finish %s: %w", key, errors.New("disk full"))
}

func (k keyErrJournal) Delete(_ context.Context, key string) error {
	return fmt.Errorf("idemhttp: journal delete %s: %w", key, errors.New("disk full"))
}

// The client's log records name the key by its digest even inside the
// error they carry: the project's journals name the key in their errors,
// and the records of a failed Finish (writeFinish) and of a failed
// withdrawal (withdraw) wrote err.Error() as it was, the key with it,
// with LogKeys off. With LogKeys the error is logged as it was. Checked
// to fail with errAttr writing err.Error() unchanged (the key was in both
// records).
func TestAttack6JournalErrorsInLogsNameTheKeyByDigest(t *testing.T) {
	const key = "caller-key-5e1d7c9a04b2"
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer ok.Close()
	for _, tt := range []struct {
		name string
		c    func(Journal) *Client
		url  string
		want string
	}{
		{"finish", func(j Journal) *Client { return &Client{Journal: j, Policy: fast()} }, ok.URL, "journal finish failed"},
		{"withdraw", refusedClient, "http://127.0.0.1:1/", "could not withdraw"},
	} {
		for _, logKeys := range []bool{false, true} {
			t.Run(fmt.Sprint(tt.name, " LogKeys=", logKeys), func(t *testing.T) {
				var out bytes.Buffer
				c := tt.c(keyErrJournal{newRecJournal()})
				c.Logger = slog.New(slog.NewTextHandler(&out, nil))
				c.LogKeys = logKeys
				req, err := http.NewRequestWithContext(WithKey(context.Background(), key), http.MethodPost, tt.url, strings.NewReader("{}"))
				require.NoError(t, err)
				if resp, err := c.Do(req); err == nil {
					require.NoError(t, resp.Body.Close())
				}
				log := out.String()
				require.Contains(t, log, tt.want)
				require.Contains(t, log, "disk full", "the journal's error is logged")
				assert.Contains(t, log, KeyDigest(key))
				assert.Equal(t, logKeys, strings.Contains(log, key), "the key itself is in the log only with LogKeys: %s", log)
			})
		}
	}
}
