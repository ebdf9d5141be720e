package filejournal

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
)

// The client-side helpers of the tests that run the journal under an
// idemhttp.Client (the root package's helpers_test.go has the same ones,
// which a package's tests cannot share).

const chargeBody = `{"amount":1000,"currency":"usd"}`

// hit is one request as the test server saw it.
type hit struct {
	Method string
	Path   string
	Key    string
	Body   string
}

// step answers one attempt.
type step func(w http.ResponseWriter, r *http.Request)

// scripted is a test server that answers the n-th request with the n-th
// step (the last step repeats) and records every request. Handlers never
// fail the test: they only record, and the test goroutine asserts.
type scripted struct {
	*httptest.Server
	mu    sync.Mutex
	hits  []hit
	steps []step
}

func newScripted(t *testing.T, steps ...step) *scripted {
	t.Helper()
	s := &scripted{steps: steps}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	n := len(s.hits)
	s.hits = append(s.hits, hit{Method: r.Method, Path: r.URL.Path, Key: r.Header.Get("Idempotency-Key"), Body: string(b)})
	st := s.steps[min(n, len(s.steps)-1)]
	s.mu.Unlock()
	st(w, r)
}

func (s *scripted) Hits() []hit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]hit(nil), s.hits...)
}

// reply answers with a status and a body.
func reply(code int, body string) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

// drop closes the connection without answering: the client cannot tell
// whether the request was processed.
func drop(w http.ResponseWriter, _ *http.Request) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// fast is a policy with tiny delays, so tests never sleep for real.
func fast() *idemhttp.Policy {
	return &idemhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}
}

func post(t *testing.T, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

// forceDelete removes key's entry whatever its state, as Delete did before
// done entries became final: for the tests of the log's mechanics (delete
// records, the index, compaction, the clock mark), which exercise a
// delete record of every kind of entry.
func (j *Journal) forceDelete(ctx context.Context, key string) error {
	j.mu.Lock()
	le := j.byKey.get(key)
	err := j.log.Writable()
	j.mu.Unlock()
	if err != nil {
		return err
	}
	if le == nil {
		return idemhttp.ErrNotFound
	}
	n, err := j.removeChunk([]*entry{le}, func(*entry) bool { return true })
	if err == nil && n == 0 {
		err = idemhttp.ErrNotFound
	}
	return err
}

// usedBytes is a journal file's bytes without the zeros the log
// preallocates after its last batch (see docs/journal-format.md): what
// tests that cut or compare files work on. It replays the file to find
// where its batches end.
func usedBytes(t testing.TB, raw []byte) []byte {
	t.Helper()
	res, err := wal.Replay(bytes.NewReader(raw), int64(len(raw)), false, func(int64, int, []byte) error { return nil })
	if err != nil || res.Truncated > 0 {
		return raw
	}
	return raw[:res.End]
}
