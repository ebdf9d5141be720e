package idemhttp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idemhttp/idemtrace"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/idemkit/idemhttp/internal/plant"
)

// ResumeResult is the outcome of resending one pending entry.
type ResumeResult struct {
	Entry      *Entry      // the entry as it was before the resend
	StatusCode int         // the response status, 0 if none
	Header     http.Header // the response headers, nil if none
	Body       []byte      // the response body, up to Policy.MaxBodyBytes
	Replayed   bool        // the server replayed a stored response
	Err        error       // why the entry was not resolved, nil if it was
}

// ResumeOptions tunes [Client.Resume]. A nil *ResumeOptions, like the
// zero value, resends every pending entry of the client's journal, 16 at a
// time, and returns the results in journal order.
type ResumeOptions struct {
	// Entries, when set, are resent instead of the journal's pending
	// entries, in this order: for entries a worker claimed from a journal
	// shared by a fleet. Each is checked as the journal's own would be
	// (retention, clock); done entries are not pruned first.
	//
	// Without Entries, on a journal a fleet shares (one with
	// ClaimPending, as contrib/postgres's), Resume claims the entries it
	// resends (ClaimPending, all it can): it resends only entries no live
	// worker holds, each under its own lease, and leaves those another
	// worker holds to it. Entries Filter leaves out stay leased to this
	// worker until their lease ends.
	Entries []*Entry

	// Concurrency is how many entries are resent at once. 0 means 16; 1
	// resends them one at a time, oldest first.
	Concurrency int

	// Filter, when set, chooses the pending entries to resend; the others
	// are left pending, untouched, and have no result. It is called once
	// per entry, before any resend, on the calling goroutine.
	Filter func(*Entry) bool

	// OnResult, when set, receives each result as soon as its entry is
	// resolved, one call at a time (never concurrently), in the order the
	// entries finish; Resume then returns no results, so a journal of a
	// million entries is resumed in constant memory. Use it for progress.
	// It must not block for long: the resends wait for it.
	OnResult func(ResumeResult)
}

// Resume resends the pending entries of the client's journal (c.Journal,
// or the in-memory one that [WithOperation] calls use without it) with
// their original keys and bodies, concurrently, as opts says (nil: all of
// them, 16 at a time, results in journal order, oldest first), and reports
// each outcome. Credentials come from [Client.PrepareRequest], never from
// the journal.
//
// An entry older than [Policy.Retention] is not resent: the server may have
// forgotten its key, so a resend could run the operation twice. It is
// marked abandoned and reported with an error wrapping [ErrKeyExpired]. An
// entry whose body was not stored cannot be resent either
// ([ErrNotReplayable]). Nor is an entry when the clock is behind the
// journal, by more than [ClockTolerance]: an entry created or updated in
// the future, or, with a journal that keeps a high-water mark (as
// [github.com/idemkit/idemhttp/filejournal.Journal] does), a clock below the latest time the journal ever
// recorded, entries pruned since included. Entries' ages cannot be known
// then, so every entry is reported with an error wrapping [ErrClockJump]
// and left pending. Done entries older than the retention are pruned
// first, unless the journal prunes by itself.
//
// The error is non-nil only when the journal itself fails, or ctx ends;
// per-entry failures are in the results. Cancelling ctx stops the
// dispatch: resends in flight end with the context's error, entries not
// reached stay pending and have no result, and the results of those
// reached are returned with ctx's error.
func (c *Client) Resume(ctx context.Context, opts *ResumeOptions) ([]ResumeResult, error) {
	c.init()
	var o ResumeOptions
	if opts != nil {
		o = *opts
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	j := c.cfg.journal
	if j == nil {
		j = c.cfg.mem
	}
	now, err := c.journalNow(ctx, j)
	if err != nil {
		return nil, fmt.Errorf("idemhttp: resume: %w", err)
	}
	pending := o.Entries
	if pending == nil {
		// A journal that prunes by itself (Retain) keeps done entries as
		// long as it was told, and longer if configured so: pruning here
		// would override that.
		if _, ok := journalAs[retainer](c.cfg.identity(j)); !ok || plant.ResumePrunes { // ResumePrunes: a planted bug (internal/plant)
			if _, err := j.Prune(ctx, now.Add(-c.cfg.pol.retention)); err != nil {
				return nil, fmt.Errorf("idemhttp: resume: prune: %w", err)
			}
		}
		if sj, ok := journalAs[sharedJournal](c.cfg.identity(j)); ok {
			pending, err = claimAll(ctx, sj)
		} else {
			pending, err = j.Pending(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("idemhttp: resume: %w", err)
		}
	}
	// The newest time the journal holds or, with a clockJournal, ever
	// held: a clock below it was set back, and every entry's age is then
	// in doubt, not only the future ones'. The entries' own times alone
	// miss a jump once the newer entries are pruned: a pending entry 25 h
	// old would look 23 h old after the clock went back 2 h, and be
	// resent under a key a server with 24 h retention has forgotten.
	newest, err := journalHighWater(ctx, c.cfg.identity(j))
	if err != nil {
		return nil, fmt.Errorf("idemhttp: resume: %w", err)
	}
	for _, e := range pending {
		newest = contract.Latest(newest, e.Created, e.Updated)
	}
	if o.Filter != nil {
		kept := make([]*Entry, 0, len(pending)) // not in place: Entries is the caller's
		for _, e := range pending {
			if o.Filter(e) {
				kept = append(kept, e)
			}
		}
		pending = kept
	}

	var (
		results []ResumeResult
		reached []bool
		mu      sync.Mutex // serialises OnResult
	)
	if o.OnResult == nil {
		results = make([]ResumeResult, len(pending))
		reached = make([]bool, len(pending))
	}
	// Each worker takes the next entry itself (claim). A dispatching
	// goroutine handing indexes over a channel made every worker that
	// finished wait for that one goroutine to run again: on a busy
	// machine, a round of 16 resends waited for it up to 16 times
	// (BenchmarkResumeFloor).
	//
	// A panic in a resend (a hook's, PrepareRequest's) or in OnResult
	// stops the dispatch and goes on in the caller's goroutine, where it
	// can be recovered, once every worker is done: a worker's goroutine
	// would end the process. The resend that panicked has freed its
	// slots (Client.do unwinds it).
	var (
		claimed   atomic.Int64 // entries handed out
		stopped   error        // ctx ended before every entry was handed out
		stopOnce  sync.Once
		panicked  any
		panicOnce sync.Once
		halted    atomic.Bool
	)
	claim := func() (int, bool) {
		if halted.Load() {
			return 0, false
		}
		if err := ctx.Err(); err != nil {
			if claimed.Load() < int64(len(pending)) {
				stopOnce.Do(func() { stopped = err })
			}
			return 0, false
		}
		i := claimed.Add(1) - 1
		if i >= int64(len(pending)) {
			return 0, false
		}
		return int(i), true
	}
	var wg sync.WaitGroup
	for range min(o.Concurrency, len(pending)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if v := recover(); v != nil {
					panicOnce.Do(func() { panicked = v; halted.Store(true) })
				}
			}()
			for i, ok := claim(); ok; i, ok = claim() {
				r := c.resumeOne(ctx, pending[i], newest)
				if o.OnResult != nil {
					func() {
						mu.Lock()
						defer mu.Unlock()
						o.OnResult(r)
					}()
					continue
				}
				results[i], reached[i] = r, true // each index has one writer
			}
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
	if o.OnResult != nil {
		return nil, stopped
	}
	if stopped != nil {
		out := results[:0]
		for i, r := range results {
			if reached[i] {
				out = append(out, r)
			}
		}
		return out, stopped
	}
	return results, nil
}

// claimBatch is how many entries Resume claims from a journal a fleet
// shares at a time.
const claimBatch = 256

// claimAll claims every pending entry of a journal a fleet shares that no
// live lease holds (ClaimPending), for Resume without Entries: what
// Pending lists includes entries other workers hold, and resending one of
// those without its lease let its holder withdraw it while this resend
// ran it, and a later run of its operation run it again under a new key
// (the simulator's seed 4158). The entries this claims are leased to
// this worker until they are resolved or the lease ends; ClaimPending
// skips live leases, this worker's own included, so the loop ends.
func claimAll(ctx context.Context, j sharedJournal) ([]*Entry, error) {
	var out []*Entry
	seen := make(map[string]bool)
	for {
		batch, err := j.ClaimPending(ctx, claimBatch)
		if err != nil {
			return nil, fmt.Errorf("claim pending: %w", err)
		}
		added := 0
		for _, e := range batch {
			if e != nil && !seen[e.Key] {
				seen[e.Key] = true
				out = append(out, e)
				added++
			}
		}
		if len(batch) < claimBatch || added == 0 {
			return out, nil
		}
	}
}

// ClockTolerance is how far ahead of the clock a journaled time may be
// before [Client.Resume] and [Client.Do] take it as a clock that was set
// back ([ErrClockJump]): clocks of machines sharing a journal, and one
// machine's clock stepped by NTP, disagree by that much.
const ClockTolerance = time.Minute

// journalHighWater returns j's high-water mark if it has one (HighWater),
// else the zero Time.
func journalHighWater(ctx context.Context, j *journalIdentity) (time.Time, error) {
	cj, ok := journalAs[clockJournal](j)
	if !ok {
		return time.Time{}, nil
	}
	t, err := cj.HighWater(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("high water: %w", err)
	}
	return t, nil
}

// resumeOne resends e through the one path of every call (Client.do):
// as the operation's one sender in this process, after reading the entry
// again (a call may have finished or withdrawn it since it was listed),
// and after the rules every resend of an existing entry passes
// (operation.judge: the retention, the clock against mark, the newest time
// the journal holds or held).
func (c *Client) resumeOne(ctx context.Context, e *Entry, mark time.Time) ResumeResult {
	r := ResumeResult{Entry: e}
	c.journalEvent(ctx, idemtrace.JournalEvent{Op: idemtrace.JournalResume, Key: e.Key, Operation: e.Operation, State: string(e.State)}, time.Time{})
	rctx := WithKey(ctx, e.Key)
	if e.Operation != "" {
		rctx = WithOperation(rctx, e.Operation)
	}
	var body io.Reader
	if e.Body != nil {
		body = bytes.NewReader(e.Body)
	}
	req, err := http.NewRequestWithContext(rctx, e.Method, e.URL, body)
	if err != nil {
		r.Err = fmt.Errorf("idemhttp: resume %s: %w: %w", e.Key, ErrInvalidRequest, err)
		return r
	}
	for k, v := range e.Header {
		req.Header[k] = v
	}
	resp, err := c.do(req, &resend{entry: e, mark: mark}, false)
	if err != nil {
		r.Err = err
		return r
	}
	defer resp.Body.Close()
	r.StatusCode, r.Header, r.Replayed = resp.StatusCode, resp.Header, Replayed(resp)
	r.Body, r.Err = io.ReadAll(io.LimitReader(resp.Body, c.cfg.pol.maxBody))
	return r
}

// resend is what Resume hands the call path: the entry it resends, and
// the journal's high-water mark it read once for all its entries.
type resend struct {
	entry *Entry
	mark  time.Time
}
