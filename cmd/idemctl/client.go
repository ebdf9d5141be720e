package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/idemtrace"
	"golang.org/x/time/rate"
)

// openJournal opens the journal at path and turns the library's errors into
// messages an operator can act on, with exit code 3. With mustExist, a
// missing file is an error instead of a new, empty journal: a typo in
// -journal must not read as "nothing pending". (The headers it must never
// store, beyond the standard credentials, are the client's SecretHeaders,
// which drops them before the journal sees them.)
//
// The journal's own pruning is off: it would delete done entries past the
// retention without the record idemctl prune keeps (JOURNAL.pruned), and
// a later batch naming one would send it again, under a key the server
// has forgotten. Done stays done until idemctl prune records and deletes it.
func openJournal(path string, mustExist bool) (*filejournal.Journal, error) {
	return openJournalWith(path, mustExist, &filejournal.Options{PruneInterval: -1})
}

// openJournalReadOnly opens the journal at path, which must exist, for
// inspection: without the writer's lock and without changing the file.
func openJournalReadOnly(path string) (*filejournal.Journal, error) {
	return openJournalWith(path, true, &filejournal.Options{ReadOnly: true})
}

// openJournalWith is openJournal with every option of the library:
// verify -repair needs SkipVerify.
func openJournalWith(path string, mustExist bool, opts *filejournal.Options) (*filejournal.Journal, error) {
	if path == "" {
		return nil, fail(exitUsage, "-journal is required")
	}
	if mustExist {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fail(exitJournal, "journal %s does not exist", path)
		}
	}
	j, err := filejournal.Open(path, opts)
	switch {
	case err == nil:
		return j, nil
	case errors.Is(err, filejournal.ErrLocked):
		return nil, fail(exitJournal, "journal %s is in use by another process (another idemctl batch or resume?): wait for it to finish, or use another -journal file", path)
	case errors.Is(err, filejournal.ErrNotJournal):
		return nil, fail(exitJournal, "%s is not an idemhttp journal (was another file named as -journal?); it was left as it was", path)
	case errors.Is(err, filejournal.ErrVersion):
		return nil, fail(exitJournal, "journal %s: %v; the file is intact: use the idemctl release that wrote it", path, err)
	case errors.Is(err, filejournal.ErrCorrupt):
		return nil, &exitError{code: exitJournal, err: &damageError{path: path, err: err}}
	default:
		return nil, fail(exitJournal, "open journal: %v", err)
	}
}

// damageError says that the journal at path is damaged and what to do
// about it. It unwraps to the library's error, so errors.Is finds
// [filejournal.ErrCorrupt], and verify reports err alone.
type damageError struct {
	path string
	err  error // the library's finding
}

// Error names the damage and the two ways out: a backup, else a repair
// that keeps a copy of the damaged file.
func (e *damageError) Error() string {
	return fmt.Sprintf("journal %s is damaged: %v\n"+
		"Restore it from a backup: its pending operations must be resent with their own keys, never new ones.\n"+
		"With no backup, 'idemctl verify -journal %s -repair' salvages the intact entries (after copying the damaged file aside)",
		e.path, e.err, e.path)
}

// Unwrap returns the library's error.
func (e *damageError) Unwrap() error { return e.err }

// counter counts attempts and the responses they got, below the retry
// loop, so it sees every attempt of every client alike. With a limiter it
// also paces them: a rate-limited API counts every attempt, retries
// included, so the pace is kept here and not per operation.
type counter struct {
	rt        http.RoundTripper
	limiter   waiter // nil: no limit
	attempts  atomic.Int64
	responses atomic.Int64
}

// waiter is what counter needs of a *rate.Limiter.
type waiter interface {
	Wait(ctx context.Context) error
}

// RoundTrip waits for the limiter, then counts and sends one attempt. A
// wait cut short by the request's context sends nothing; the client sees
// an error and keeps the operation pending, as for any attempt it cannot
// be sure of.
func (c *counter) RoundTrip(r *http.Request) (*http.Response, error) {
	if c.limiter != nil {
		if err := c.limiter.Wait(r.Context()); err != nil {
			if r.Body != nil {
				r.Body.Close() // RoundTrip must close the body, even on error
			}
			return nil, fmt.Errorf("waiting for -rate: %w", err)
		}
	}
	c.attempts.Add(1)
	resp, err := c.rt.RoundTrip(r)
	if resp != nil {
		c.responses.Add(1)
	}
	return resp, err
}

// newLimiter returns a limiter of perSecond requests a second, none when
// perSecond is 0. The burst is one request (more when the rate is above
// one per millisecond, where a burst of one would cap it), so the pace is
// even from the first second: an API's limit is usually a window a burst
// could overrun.
func newLimiter(perSecond float64) waiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond/1000)))
}

// newTransport returns a transport of its own, so the command can close
// its idle connections when done, with a pool sized for concurrency.
func newTransport(concurrency int) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = max(100, concurrency)
	t.MaxIdleConnsPerHost = max(2, concurrency)
	return t
}

// clientConfig is what the batch and resume commands share.
type clientConfig struct {
	journal  idemhttp.Journal
	rt       http.RoundTripper
	timeout  time.Duration // per attempt
	attempts int           // 0 means the policy's default
	// retention is Policy.Retention: how long the server keeps keys; the
	// client tells the journal, which keeps done entries as long. 0 means
	// the policy's default (24 h).
	retention time.Duration
	// maxRetryAfter is Policy.MaxRetryAfter: the longest Retry-After a
	// call waits for; a longer one parks the operation. 0 means the
	// policy's default (60 s).
	maxRetryAfter time.Duration
	creds         *credentialFlags

	// stopping, when set and true, makes every call that has not sent
	// its first attempt fail with errStopping, sending nothing.
	stopping *atomic.Bool
	// onJournal, when set, sees every journal operation (Hooks.OnJournal).
	onJournal func(context.Context, idemtrace.JournalEvent)
}

// newClient returns an idemhttp client whose credentials come only from
// PrepareRequest, so they never reach the journal, and are listed as
// secret for good measure. PrepareRequest is also the stop gate: it runs
// once per call, in Do and in Resume, before anything is sent.
func newClient(cfg clientConfig) *idemhttp.Client {
	c := &idemhttp.Client{
		HTTPClient: &http.Client{Transport: cfg.rt, Timeout: cfg.timeout},
		Journal:    cfg.journal,
		Policy:     &idemhttp.Policy{MaxAttempts: cfg.attempts, Retention: cfg.retention, MaxRetryAfter: cfg.maxRetryAfter},
	}
	if cfg.onJournal != nil {
		c.Hooks = &idemtrace.Hooks{OnJournal: cfg.onJournal}
	}
	var h http.Header
	if cfg.creds != nil {
		h = cfg.creds.headers
	}
	if len(h) > 0 {
		c.SecretHeaders = cfg.creds.names()
	}
	if len(h) > 0 || cfg.stopping != nil {
		c.PrepareRequest = func(r *http.Request) error {
			if cfg.stopping != nil && cfg.stopping.Load() {
				return errStopping
			}
			for k, vv := range h {
				r.Header[k] = slices.Clone(vv)
			}
			return nil
		}
	}
	return c
}

// neverConnected reports whether err says the request never reached a
// server: the dial failed (connection refused, unknown host, no route).
func neverConnected(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// describeJournalErr adds what to do to a journal failure in the middle
// of a command.
func describeJournalErr(path string, err error) error {
	if errors.Is(err, filejournal.ErrCorrupt) {
		return &exitError{code: exitJournal, err: &damageError{path: path, err: err}}
	}
	return fail(exitJournal, "journal %s: %v", path, err)
}
