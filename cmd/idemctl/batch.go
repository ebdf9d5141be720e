package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
	"github.com/idemkit/idemhttp/internal/contract"
)

const batchSynopsis = `Usage: idemctl batch -url URL -in FILE -journal FILE [-concurrency N] [-rate N]
                     [-header 'Name: value' ...] [-header-env 'Name=VAR' ...] [flags]

Sends one request per input line through idemhttp: each operation gets an
idempotency key before its first attempt, journaled durably, and keeps it
across retries and reruns. Running the same command again after a crash,
Ctrl-C or failures resends the pending operations with their keys and skips
the done ones, so no operation runs twice.

-journal postgres://... shares the journal with other machines: every
idemctl batch given it loads the input, and each operation is sent by one
of them (leases; see -lease and README.md).

Keys are derived from the operation id: DeriveKey(secret, id), HMAC-SHA256.
The secret comes from the environment variable IDEMCTL_KEY_SECRET (or the
one -key-secret-env names), else from the key file (-key-file, by default
the journal's path + ".key"), created with a random secret (mode 0600) on
the first run. So a rerun sends the same keys even if the journal is lost:
back the key file up with the journal. The secret is never printed.
-random-keys mints random keys instead, known only to the journal.

` + inputFormat + `
Output: one JSON line per operation on stdout:
  {"operation":"charge-0001","line":1,"key":"...","result":"ok","source":"run","status":200,"attempts":1,"state":"done","response":{...}}
  result: ok (2xx), failed (a definite failure), pending (outcome unknown: rerun to resend with the same key)
  source: run (sent from the input), resume (pending from an earlier run), journal (done earlier: skipped),
          pruned (pruned from the journal: its recorded outcome, with -pruned skip)
Progress and a summary go to stderr.

Operations that idemctl prune deleted from the journal are listed in
JOURNAL.pruned; a batch naming one refuses to run (exit 6) before sending
anything, unless -pruned skip or -pruned send says what to do.

Headers given with -header or -header-env are credentials: added to each
request at send time, never written to the journal or printed. URLs are
journaled: keep credentials out of -url and of paths' queries.

SIGINT or SIGTERM: no new operation starts; those in flight finish (up to
-grace) and are recorded; exit 130. A second Ctrl-C quits at once; the
journal still holds every key.

Exit codes: 0 all ok; 1 some failed or pending; 2 usage; 3 journal or key
file error; 4 input error (malformed lines are listed on stderr, the others
still run; if none is valid, nothing is sent); 5 server never reached;
6 refused, nothing sent (pruned operations); 130 interrupted.
`

// batchOptions are the batch command's settings.
type batchOptions struct {
	base          *url.URL
	in            string
	journal       string
	concurrency   int
	keys          keyFlags
	keySecret     []byte // nil: keys minted and journaled (-random-keys)
	creds         credentialFlags
	timeout       time.Duration
	attempts      int
	grace         time.Duration
	progress      string
	pruned        string  // refuse, skip or send: input operations that prune deleted
	inFormat      string  // auto, jsonl or csv
	rate          float64 // requests per second, 0: no limit
	checkDone     bool    // read done rows' requests back to warn about changed lines
	retention     time.Duration
	maxRetryAfter time.Duration
	fleet         fleetFlags // with a postgres:// journal
	spec          inputSpec
}

func batchCommand(ctx context.Context, args []string, e env) error {
	o := &batchOptions{creds: credentialFlags{getenv: e.getenv}}
	fs := newFlagSet("batch", batchSynopsis, e)
	rawURL := fs.String("url", "", "`URL` of the requests; an input line's path is resolved against it")
	fs.StringVar(&o.in, "in", "", "input `FILE` (JSON Lines or CSV); - reads stdin")
	fs.StringVar(&o.inFormat, "in-format", "auto", "input format: jsonl, csv, or auto (by the file's extension, .csv or .jsonl, else by\nits first character: { or # means JSON Lines)")
	fs.StringVar(&o.spec.body, "body-format", bodyJSON, "request bodies: json (application/json) or form (application/x-www-form-urlencoded,\nas Stripe's API takes: a JSON object body becomes name=value&nested[field]=value)")
	fs.StringVar(&o.journal, "journal", "", "journal `FILE`, created if missing: keys and outcomes across runs; or postgres://...: a journal\nseveral machines share, each operation sent by one of them")
	fs.IntVar(&o.concurrency, "concurrency", 8, "operations in flight at once")
	fs.Float64Var(&o.rate, "rate", 0, "requests per second at most, retries included (e.g. 25, or 0.5 for one every 2s); 0: no limit")
	fs.StringVar(&o.keys.secretEnv, "key-secret-env", defaultSecretEnv, "derive each key from the operation id with HMAC-SHA256 keyed by environment variable `VAR`\n(at least 16 bytes), so reruns send the same keys even without the journal;\nwhen VAR is unset, the secret comes from -key-file")
	fs.StringVar(&o.keys.keyFile, "key-file", "", "`FILE` holding the key secret when the environment variable is unset; created (mode 0600,\n32 random bytes) on first use. Default: the journal's path + \".key\". Back it up with the journal")
	fs.BoolVar(&o.keys.random, "random-keys", false, "mint random keys, kept only in the journal: a lost journal or pruned entry then means\nthe rerun sends a new key, and the server runs the operation again")
	o.creds.register(fs)
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "timeout of one attempt")
	fs.IntVar(&o.attempts, "attempts", 0, "attempts per operation, the first included; 0 means idemhttp's default (4)")
	fs.DurationVar(&o.grace, "grace", 10*time.Second, "after SIGINT or SIGTERM, how long operations in flight may take to finish")
	fs.StringVar(&o.progress, "progress", "auto", "progress on stderr: auto (a bar on a terminal, else lines), bar, lines or none")
	fs.BoolVar(&o.checkDone, "check-done", false, "read back the journaled request of every input operation already done, and warn (exit 4)\nwhen the line changed since; off, done rows are skipped from the journal's index alone")
	retention := retentionFlag(fs)
	maxRetryAfter := maxRetryAfterFlag(fs)
	o.fleet.register(fs)
	fs.StringVar(&o.pruned, "pruned", "refuse", "input operations that idemctl prune deleted from the journal (listed in JOURNAL.pruned):\nrefuse (exit 6 before sending anything), skip (report the recorded outcome, send nothing)\nor send (send them again: with derived keys the server replays them if it still keeps the key)")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	o.retention, o.maxRetryAfter = *retention, *maxRetryAfter
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		switch f.Name {
		case "key-secret-env":
			o.keys.secretEnvSet = true
		case "key-file":
			o.keys.keyFileSet = true
		}
	})
	if err := o.validate(rest, *rawURL, e.getenv); err != nil {
		return err
	}
	if err := o.fleet.check(o.journal, set); err != nil {
		return err
	}
	return runBatch(ctx, o, e)
}

// validate checks the flags and fills in the parsed values.
func (o *batchOptions) validate(rest []string, rawURL string, getenv func(string) string) error {
	if len(rest) > 0 {
		return fail(exitUsage, "unexpected argument %q (flags only; see -h)", rest[0])
	}
	base, err := parseBaseURL(rawURL)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	o.base = base
	switch {
	case o.in == "":
		return fail(exitUsage, "-in is required")
	case o.journal == "":
		return fail(exitUsage, "-journal is required")
	case o.concurrency < 1:
		return fail(exitUsage, "-concurrency must be at least 1")
	case o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0):
		return fail(exitUsage, "-rate must be a number of requests per second, 0 for no limit")
	case o.timeout <= 0:
		return fail(exitUsage, "-timeout must be positive")
	case o.attempts < 0:
		return fail(exitUsage, "-attempts must not be negative")
	case o.grace < 0:
		return fail(exitUsage, "-grace must not be negative")
	case o.maxRetryAfter < 0:
		return fail(exitUsage, "-max-retry-after must not be negative")
	case o.progress != "auto" && o.progress != "bar" && o.progress != "lines" && o.progress != "none":
		return fail(exitUsage, "-progress must be auto, bar, lines or none")
	case o.inFormat != "auto" && o.inFormat != formatJSONL && o.inFormat != formatCSV:
		return fail(exitUsage, "-in-format must be auto, jsonl or csv")
	case o.spec.body != bodyJSON && o.spec.body != bodyForm:
		return fail(exitUsage, "-body-format must be json or form")
	case o.pruned != "refuse" && o.pruned != "skip" && o.pruned != "send":
		return fail(exitUsage, "-pruned must be refuse, skip or send")
	}
	if err := o.creds.check(); err != nil {
		return err
	}
	if err := checkRetention(o.retention); err != nil {
		return err
	}
	if o.keys.secretEnv == "" {
		return fail(exitUsage, "-key-secret-env must name an environment variable")
	}
	return nil
}

// runBatch runs the batch: resume what an earlier run left pending, skip
// what it finished, send the rest with o.concurrency workers.
func runBatch(ctx context.Context, o *batchOptions, e env) (err error) {
	ops, bad, err := loadInput(o.in, o.base, e.stdin, o.inFormat, o.spec.body)
	if err != nil {
		return err
	}
	for i, b := range bad {
		if i == maxListedLines {
			fmt.Fprintf(e.stderr, "idemctl batch: ... and %d more malformed lines\n", len(bad)-i)
			break
		}
		fmt.Fprintf(e.stderr, "idemctl batch: %s:%d: %v\n", o.in, b.Line, b.Err)
	}
	inputErrs := len(bad)
	if len(ops) == 0 && len(bad) > 0 {
		// Not one line to run: the input is in another format, or
		// broken throughout. Say so, rather than run nothing and count.
		return fail(exitInput, "none of the %d input lines is a valid operation; nothing was sent (-in-format jsonl or csv, -h for the formats)", len(bad))
	}

	if isPostgresURL(o.journal) {
		// A shared journal: no key file beside it, no prune record.
		if o.keys.random || o.keys.keyFileSet || e.getenv(o.keys.secretEnv) != "" {
			var createKey string
			if o.keySecret, createKey, err = o.keys.secret(o.journal, e.getenv); err != nil {
				return err
			}
			if createKey != "" {
				if o.keySecret, err = o.keys.createSecret(createKey); err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "idemctl batch: created key file %s (mode 0600): give the fleet's other machines the same file\n", createKey)
			}
		}
		return runFleetBatch(ctx, o, e, ops, inputErrs)
	}

	// Nothing is created before everything is known to be sound: an
	// unreadable key file stops the run before the journal is touched, and
	// a -journal naming the wrong file (the input, say) before a key file
	// is created beside it. So: the secret if it exists; an existing
	// journal opened (Open refuses a file that is not a journal, leaving
	// it as it was); only then a missing key file created, and last a
	// missing journal.
	if err := checkNotInput(o.in, o.journal); err != nil {
		return err
	}
	_, statErr := os.Stat(o.journal)
	journalExists := statErr == nil
	var createKey string
	o.keySecret, createKey, err = o.keys.secret(o.journal, e.getenv)
	if err != nil {
		return err
	}
	var fileJournal *filejournal.Journal
	if journalExists {
		if fileJournal, err = openJournal(o.journal, false); err != nil {
			return err
		}
	}
	if createKey != "" {
		if o.keySecret, err = o.keys.createSecret(createKey); err != nil {
			if fileJournal != nil {
				_ = fileJournal.Close()
			}
			return err
		}
	}
	if o.keys.createdFile != "" {
		fmt.Fprintf(e.stderr, "idemctl batch: created key file %s (mode 0600): every key is derived from it; back it up with the journal\n", o.keys.createdFile)
		if journalExists {
			// A journal from an older idemctl (random keys by default), or
			// one whose key file was lost. Its entries keep their keys;
			// only operations it no longer knows get keys from the new
			// secret, and prune's record stops those it pruned.
			fmt.Fprintf(e.stderr, "idemctl batch: note: journal %s already existed without this key file: its entries keep their journaled keys; if an earlier key file was lost, restore it before running operations the journal no longer knows\n", o.journal)
		}
	}
	if fileJournal == nil {
		if fileJournal, err = openJournal(o.journal, false); err != nil {
			return err
		}
	}
	defer func() {
		if cerr := fileJournal.Close(); cerr != nil && err == nil {
			err = fail(exitJournal, "close journal: %v", cerr)
		}
	}()
	var fj batchJournal = fileJournal
	if e.wrapJournal != nil {
		fj = e.wrapJournal(fj)
	}

	ops, prunedSkips, err := o.checkPruned(fj, ops, e)
	if err != nil {
		return err
	}

	// The pending entries are read whole: Resume needs their requests
	// anyway, and a changed line is found by comparing fingerprints. Done
	// entries, most of a rerun's journal, are only looked up by id below.
	pending, err := fj.Pending(context.Background())
	if err != nil {
		return describeJournalErr(o.journal, err)
	}
	pendingByOp := make(map[string]*idemhttp.Entry)
	for _, p := range pending {
		if p.Operation != "" {
			pendingByOp[p.Operation] = p
		}
	}
	byID := make(map[string]operation, len(ops))
	for _, op := range ops {
		byID[op.ID] = op
	}
	// The pending entries of this input's operations go with the input,
	// concurrently, not through Resume: Do finds the pending entry by
	// operation id and resends it with its key, as Resume would. Resume
	// keeps the rest (other inputs' entries, changed lines, entries past
	// the key retention, which it marks abandoned).
	// The total counts every operation either path reports.
	withInput := make(map[string]bool)
	total := len(ops) + len(prunedSkips)
	for _, p := range pending {
		if op, ok := byID[p.Operation]; ok && o.resendable(op, p) {
			withInput[p.Key] = true
			continue
		}
		if _, ok := byID[p.Operation]; !ok {
			total++
		}
	}

	r := newRunner(runnerConfig{
		name: "batch", path: o.journal, fj: fj, concurrency: o.concurrency, timeout: o.timeout,
		attempts: o.attempts, creds: &o.creds, progress: o.progress, total: total, env: e,
		contentType: o.spec.contentType(), rate: o.rate, retention: o.retention, maxRetryAfter: o.maxRetryAfter,
	})
	defer r.close()
	for _, op := range ops {
		r.lines[op.ID] = op.Line
	}
	r.hide = func(e *idemhttp.Entry) bool { return withInput[e.Key] }
	opCtx, stop := r.watch(ctx, o.grace)
	defer stop()

	for _, res := range prunedSkips {
		r.report(res)
	}
	resumed, err := r.resume(opCtx)
	if err != nil {
		return err
	}

	// What the journal says after resuming decides what to send, row by
	// row with Lookup: from the index, without reading requests back.
	warnChanged := func(op operation, key string) {
		// The journal's request stands: it may have run. A changed
		// request is a new operation and needs a new id.
		inputErrs++
		r.prog.printf("idemctl batch: %s:%d: operation %q differs (method, URL or body) from the request journaled under key %s; the journaled one stands: give a new operation a new id\n",
			o.in, op.Line, op.ID, key)
	}
	var todo []operation
	for _, op := range ops {
		if p := pendingByOp[op.ID]; p != nil && p.Fingerprint != fingerprint(op) {
			warnChanged(op, p.Key)
		}
		if resumed[op.ID] {
			continue // reported by resume
		}
		en, err := fj.Lookup(context.Background(), op.ID)
		switch {
		case errors.Is(err, idemhttp.ErrNotFound):
			todo = append(todo, op)
		case err != nil:
			return describeJournalErr(o.journal, err)
		case en.State == idemhttp.StatePending:
			// Left pending by an earlier run: resent with its key. (Or
			// one Resume did not reach because a signal came: sendAll
			// starts nothing then.)
			op.resume, op.key = true, en.Key
			todo = append(todo, op)
		default:
			// Done (or abandoned): nothing is sent, so a changed line
			// cannot run; only -check-done reads the request back to
			// say so.
			if o.checkDone {
				full, err := fj.Get(context.Background(), en.Key)
				if err != nil {
					return describeJournalErr(o.journal, err)
				}
				if full.Fingerprint != fingerprint(op) {
					warnChanged(op, en.Key)
				}
			}
			r.report(skippedResult(op, en))
		}
	}

	r.sendAll(ctx, opCtx, todo, o)
	stop()
	return r.summary(ctx, total, inputErrs)
}

// checkPruned finds the input operations that idemctl prune deleted from
// the journal, by the record beside it, before anything is sent: with
// their entries gone, sending them would mint new keys (random keys) or
// count on the server still keeping theirs. By -pruned it refuses the run,
// takes them out of ops and reports their recorded outcome, or sends them.
// An operation back in the journal (sent again by an earlier -pruned send)
// is the journal's again.
func (o *batchOptions) checkPruned(fj batchJournal, ops []operation, e env) ([]operation, []*result, error) {
	path := o.journal + prunedSuffix
	inInput := make(map[string]bool, len(ops))
	for _, op := range ops {
		inInput[op.ID] = true
	}
	recs, err := readPruned(path, func(id string) bool { return inInput[id] })
	if err != nil {
		return nil, nil, fail(exitJournal, "read the record of pruned operations: %v", err)
	}
	var hit []operation
	for _, op := range ops {
		if _, ok := recs[op.ID]; ok {
			hit = append(hit, op)
		}
	}
	if len(hit) == 0 {
		return ops, nil, nil
	}
	pruned := make(map[string]bool)
	var names []string
	for _, op := range hit {
		_, err := fj.Lookup(context.Background(), op.ID)
		if err != nil && !errors.Is(err, idemhttp.ErrNotFound) {
			return nil, nil, describeJournalErr(o.journal, err)
		}
		if err != nil {
			pruned[op.ID] = true
			if len(names) < 5 {
				names = append(names, fmt.Sprintf("%q (line %d)", op.ID, op.Line))
			}
		}
	}
	if len(pruned) == 0 {
		return ops, nil, nil
	}
	more := ""
	if len(pruned) > len(names) {
		more = fmt.Sprintf(" and %d more", len(pruned)-len(names))
	}
	switch o.pruned {
	case "refuse":
		return nil, nil, fail(exitRefused, "%d input operations were pruned from the journal (recorded in %s): %s%s. Nothing was sent: "+
			"the journal no longer says whether they ran. Remove them from the input, or rerun with -pruned skip (report the recorded outcome) "+
			"or -pruned send (send them again; safe only while the server keeps their keys)",
			len(pruned), path, strings.Join(names, ", "), more)
	case "send":
		warn := "with derived keys, the server replays those it still keeps the keys of, and runs the others again"
		if o.keySecret == nil {
			warn = "with -random-keys they get new keys: the server runs every one of them again"
		}
		fmt.Fprintf(e.stderr, "idemctl batch: sending %d operations pruned from the journal again (-pruned send): %s%s; %s\n", len(pruned), strings.Join(names, ", "), more, warn)
		return ops, nil, nil
	}
	var kept []operation
	var skips []*result
	for _, op := range ops {
		if !pruned[op.ID] {
			kept = append(kept, op)
			continue
		}
		rec := recs[op.ID]
		res := &result{
			ID: op.ID, Line: op.Line, Key: rec.Key, Source: sourcePruned, Status: rec.Status, Skipped: true, State: rec.State,
			Error: fmt.Sprintf("pruned from the journal on %s; not sent (-pruned skip)", rec.Pruned.UTC().Format(time.RFC3339)),
		}
		res.classify()
		switch {
		case rec.State != idemhttp.StateDone:
			// Pruned with -include-pending: nobody knows whether it ran,
			// and no rerun of this batch will find out.
			res.Result = resultFailed
			res.Error = fmt.Sprintf("pruned from the journal while %s on %s: whether it ran is unknown; check with the server",
				rec.State, rec.Pruned.UTC().Format(time.RFC3339))
		case res.Result == resultOK:
			res.Error = ""
		}
		skips = append(skips, res)
	}
	return kept, skips, nil
}

// checkNotInput refuses a journal path that names the input file: opening
// it would refuse it as not a journal anyway, but saying which mistake it
// is helps. Nothing is touched either way.
func checkNotInput(in, journal string) error {
	if in == "-" {
		return nil
	}
	fi, err := os.Stat(in)
	if err != nil {
		return nil // reported by the input's own checks
	}
	if ji, err := os.Stat(journal); err == nil && os.SameFile(fi, ji) {
		return fail(exitUsage, "-journal %s is the input file (-in): name a journal file of its own, such as %s.journal; nothing was touched", journal, strings.TrimSuffix(in, filepath.Ext(in)))
	}
	return nil
}

// resendable reports whether the pending entry p of op can be resent by
// sending op: it is the same request under the key op would use, and
// young enough that the server still knows the key.
func (o *batchOptions) resendable(op operation, p *idemhttp.Entry) bool {
	if p.Fingerprint != fingerprint(op) || time.Since(p.Created) >= o.retention {
		return false
	}
	if o.keySecret != nil {
		if key, err := idemhttp.DeriveKey(o.keySecret, op.ID); err != nil || key != p.Key {
			return false
		}
	}
	return true
}

// sendAll sends ops with o.concurrency workers, starting none once ctx
// (the signal) is done.
func (r *runner) sendAll(ctx, opCtx context.Context, ops []operation, o *batchOptions) {
	work := make(chan operation)
	var wg sync.WaitGroup
	for range min(o.concurrency, len(ops)) {
		wg.Go(func() {
			for op := range work {
				r.do(opCtx, op, o.keySecret)
			}
		})
	}
feed:
	for _, op := range ops {
		if ctx.Err() != nil || r.stopping.Load() {
			break
		}
		select {
		case work <- op:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
}

// skippedResult reports an operation that an earlier run finished.
func skippedResult(op operation, en *idemhttp.Entry) *result {
	res := &result{
		ID:       op.ID,
		Line:     op.Line,
		Key:      en.Key,
		Source:   sourceJournal,
		Status:   en.LastStatus,
		Skipped:  true,
		Attempts: en.Attempts,
		State:    en.State,
	}
	if en.State == idemhttp.StateAbandoned {
		res.Error = "abandoned: it stayed pending longer than the server keeps keys, so it was not resent; check with the server whether it ran"
	}
	res.classify()
	return res
}

// sniffFormat decides an input's format: by the file's extension, else by
// its first character that is not white space: JSON Lines start with an
// object or a comment, CSV with a header.
func sniffFormat(path string, br *bufio.Reader) string {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".csv":
		return formatCSV
	case ".jsonl", ".ndjson", ".json":
		return formatJSONL
	}
	for n := 1; n <= 4096; n++ {
		b, err := br.Peek(n)
		if len(b) < n || err != nil {
			break
		}
		switch c := b[n-1]; c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{', '#':
			return formatJSONL
		default:
			return formatCSV
		}
	}
	return formatJSONL
}

// fingerprint is the fingerprint the client journals for op, to tell
// whether the input still describes the journaled request.
func fingerprint(op operation) string {
	u, err := url.Parse(op.URL)
	if err != nil {
		return ""
	}
	ju, err := contract.JournalURLOf(u, nil)
	if err != nil {
		return "" // a journal refuses it: it was never journaled
	}
	return contract.Fingerprint(op.Method, ju, op.Body)
}

// maxListedLines bounds the malformed lines listed on stderr.
const maxListedLines = 20

// loadInput reads the input file ("-": stdin) in format (auto, jsonl or
// csv) with bodies in bodyFormat.
func loadInput(path string, base *url.URL, stdin io.Reader, format, bodyFormat string) ([]operation, []lineError, error) {
	var in io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, fail(exitInput, "input: %v", err)
		}
		defer f.Close()
		in = f
	}
	br := bufio.NewReaderSize(in, 64<<10)
	if format == "auto" {
		format = sniffFormat(path, br)
	}
	ops, bad, err := readInputAs(br, base, inputSpec{format: format, body: bodyFormat})
	if err != nil {
		return nil, nil, fail(exitInput, "read input %s: %v", path, err)
	}
	return ops, bad, nil
}
