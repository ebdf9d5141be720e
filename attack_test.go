package idemhttp

// Issue 31 §3: a helper with fresh eyes attacked the client as a
// demanding user would. Each test here pins one thing it found, and is
// named after it.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bytesJournal is a memory journal that also keeps, as an append-only
// file would, everything it was ever asked to store: what it stores of an
// entry (Entry.Sanitized) stays in its bytes after the entry is withdrawn.
type bytesJournal struct {
	*memJournal
	mu    sync.Mutex
	bytes strings.Builder
}

func newBytesJournal() *bytesJournal { return &bytesJournal{memJournal: newMemJournal(24 * time.Hour)} }

func (j *bytesJournal) Begin(ctx context.Context, e *Entry) (*Entry, error) {
	if s, err := e.Sanitized(); err == nil {
		j.mu.Lock()
		fmt.Fprintf(&j.bytes, "%s %s %s %q %v\n", s.Key, s.Method, s.URL, s.Body, s.Header)
		j.mu.Unlock()
	}
	return j.memJournal.Begin(ctx, e)
}

func (j *bytesJournal) String() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.bytes.String()
}

// A credential under a header name that is not a token ("Authorization "
// with a trailing space, "X-Api-Key:" with the colon, as a header map
// filled from configuration may have it) is no header net/http sends: the
// call is refused. But it was refused after its entry was begun, and the
// secret-name rule (matched in any letter case, not in any spelling) kept
// it, so the credential rested in the journal's bytes (a file journal's
// Begin is on disk, and its withdrawal appends a record, it erases none).
// Checked to fail with the contract's secret-header rule as it was
// (names matched by letter case only).
func TestAttackNonTokenSecretHeaderNeverReachesTheJournal(t *testing.T) {
	for _, name := range []string{"Authorization ", "X-Api-Key:", " Cookie", "Proxy-Authorization\t"} {
		t.Run(strings.TrimSpace(name), func(t *testing.T) {
			srv := newScripted(t, reply(http.StatusCreated, "{}"))
			j := newBytesJournal()
			c := &Client{Journal: j, Policy: fast()}
			req := post(t, srv.URL, chargeBody).WithContext(WithOperation(context.Background(), "op-header"))
			req.Header[name] = []string{"sk_live_attack_secret"}
			_, err := c.Do(req)
			require.ErrorIs(t, err, ErrInvalidRequest, "net/http would not send it")
			assert.Empty(t, srv.Hits())
			assert.NotContains(t, j.String(), "sk_live_attack_secret", "the credential rests in the journal's bytes")
		})
	}
}
