package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

const pendingSynopsis = `Usage: idemctl pending -journal FILE [-json] [-all]

Lists the journal's entries that need attention:
  pending    the outcome is unknown; idemctl resume or rerunning the batch
             resends them with their keys
  abandoned  pending longer than the server keeps keys: check by hand
  parked     pending, and the server asked to come back at a time (its
             Retry-After, longer than the client waits): resume and reruns
             send it only from then on (the NOT BEFORE column); one parked
             past the server's key retention is abandoned, never sent
  reconcile  done, but the final answer was a server error (5xx) that the
             server stored and replays to every retry with the key (Stripe
             does so for a 500): resending can never finish it, and the
             operation may have run in full, in part or not at all
A table by default; -json prints one JSON object per line (bodies left out:
see idemctl inspect), "reconcile": true on the entries to reconcile,
"not_before" on the parked ones.
Attempts are recorded with an outcome, so a pending entry a killed run left
behind shows ? attempts (0 in JSON): its request may have been sent.

To reconcile an entry (and an abandoned one): look up the operation in the
server's own records (its dashboard, or a list call filtered by your own
reference, such as the metadata you sent), by its key or operation id. If
it ran, record its result; if it did not, run it again under a new
operation id (rerunning the same id does nothing: done is done, and the
server would replay the same error). The entry itself needs nothing: prune
forgets it after the retention.

Exit codes: 0 nothing pending, abandoned or to reconcile; 1 some entries
are (listed); 2 usage; 3 journal error. So a script can wait for a journal
to settle: idemctl pending -journal FILE >/dev/null && echo settled
`

func pendingCommand(_ context.Context, args []string, e env) error {
	fs := newFlagSet("pending", pendingSynopsis, e)
	path := fs.String("journal", "", "journal `FILE`")
	asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
	all := fs.Bool("all", false, "list done entries too")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fail(exitUsage, "unexpected argument %q", rest[0])
	}
	fj, err := openJournalReadOnly(*path)
	if err != nil {
		return err
	}
	defer fj.Close()
	entries, err := fj.Entries(context.Background())
	if err != nil {
		return describeJournalErr(*path, err)
	}
	if !*all {
		entries = slices.DeleteFunc(entries, func(en *idemhttp.Entry) bool { return !needsAttention(en) })
	}
	unsettled := 0
	for _, en := range entries {
		if needsAttention(en) {
			unsettled++
		}
	}
	if len(entries) == 0 && !*asJSON {
		fmt.Fprintf(e.stderr, "idemctl pending: nothing pending in %s\n", *path)
	}
	if err := listEntries(e, entries, *asJSON, time.Now()); err != nil {
		return err
	}
	if unsettled > 0 {
		return fail(exitFailed, "%d entries pending, abandoned or to reconcile in %s", unsettled, *path)
	}
	return nil
}

// needsAttention reports whether pending lists en without -all: pending,
// abandoned, or to reconcile.
func needsAttention(en *idemhttp.Entry) bool {
	return en.State != idemhttp.StateDone || toReconcile(en)
}

// toReconcile reports whether en is done with a server error (5xx) as
// its final answer: a failure the server stored and replays to every
// retry with the key (the client returns a replayed failure as final),
// so no resend can finish the operation, and whether it ran, in part or
// at all, only the server's own records can say.
func toReconcile(en *idemhttp.Entry) bool {
	return en.State == idemhttp.StateDone && en.LastStatus >= 500 && en.LastStatus <= 599
}

// stateText is an entry's STATE in tables: its state, "reconcile" for a
// done entry to reconcile, "parked" for a pending one with a not-before.
func stateText(en *idemhttp.Entry) string {
	switch {
	case toReconcile(en):
		return "reconcile"
	case parked(en):
		return "parked"
	}
	return string(en.State)
}

// parked reports whether en is pending with a not-before time: the
// server asked to come back then, and nothing sends it before. (Shown
// until the entry is resent, the time passed or not: the journal's clock
// decides, at the resend.)
func parked(en *idemhttp.Entry) bool {
	return en.State == idemhttp.StatePending && !en.NotBefore.IsZero()
}

// reconcileNote explains the "reconcile" of stateText.
const reconcileNote = "STATE reconcile: done with a server error the server stored and replays; it may have run in part: check the server's own records (see idemctl pending -h)"

// attemptsText renders an entry's attempts. The journal counts them when
// an outcome is recorded (Finish), so a pending entry with none recorded
// may well have been sent, by a process that died before learning the
// outcome: "?", not 0.
func attemptsText(en *idemhttp.Entry) string {
	if en.Attempts == 0 && en.State != idemhttp.StateDone {
		return "?"
	}
	return fmt.Sprint(en.Attempts)
}

// unknownAttemptsNote explains the "?" of attemptsText.
const unknownAttemptsNote = "ATTEMPTS ?: none recorded yet; attempts are recorded with an outcome, so its requests may have been sent by a run that died before learning it"

// writeTable prints entries as an aligned table, with a NOT BEFORE
// column when one of them is parked.
func writeTable(w io.Writer, entries []*idemhttp.Entry, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	withNotBefore := slices.ContainsFunc(entries, parked)
	header := "OPERATION\tKEY\tMETHOD\tURL\tAGE\tATTEMPTS\tSTATUS\tSTATE"
	if withNotBefore {
		header += "\tNOT BEFORE"
	}
	fmt.Fprintln(tw, header)
	unknown, reconcile := false, false
	for _, en := range entries {
		status := "-"
		if en.LastStatus != 0 {
			status = fmt.Sprint(en.LastStatus)
		}
		op := en.Operation
		if op == "" {
			op = "-"
		}
		attempts := attemptsText(en)
		unknown = unknown || attempts == "?"
		reconcile = reconcile || toReconcile(en)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s",
			op, en.Key, en.Method, en.URL, age(now, en.Created), attempts, status, stateText(en))
		if withNotBefore {
			nb := "-"
			if parked(en) {
				nb = notBeforeText(now, en.NotBefore)
			}
			fmt.Fprintf(tw, "\t%s", nb)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fail(exitFailed, "write: %v", err)
	}
	for _, note := range []struct {
		show bool
		text string
	}{{unknown, unknownAttemptsNote}, {reconcile, reconcileNote}} {
		if !note.show {
			continue
		}
		if _, err := fmt.Fprintln(w, note.text); err != nil {
			return fail(exitFailed, "write: %v", err)
		}
	}
	return nil
}

// notBeforeText renders a parked entry's time: UTC, and how far ahead
// of now it is ("passed" once it has).
func notBeforeText(now, t time.Time) string {
	if d := t.Sub(now).Round(time.Second); d > 0 {
		return t.UTC().Format(time.RFC3339) + " (in " + d.String() + ")"
	}
	return t.UTC().Format(time.RFC3339) + " (passed)"
}

// age renders how long ago t was, to the second.
func age(now, t time.Time) string {
	return now.Sub(t).Round(time.Second).String()
}

const resumeSynopsis = `Usage: idemctl resume -journal FILE [-header 'Name: value' ...] [-header-env 'Name=VAR' ...] [flags]

Resends every pending entry of the journal with its original key, method,
URL and body (idemhttp Client.Resume), -concurrency at a time, and
prints each outcome as a JSON line (see idemctl batch -h). The URLs are the
stored ones; credentials are not stored, so pass them again with -header or
-header-env. An entry older than the server's key retention (-retention,
24h) is not resent but marked abandoned: check with the server whether it
ran.

Exit codes: 0 all resolved; 1 some failed or stay pending; 2 usage;
3 journal error; 5 server never reached; 130 interrupted.
`

func resumeCommand(ctx context.Context, args []string, e env) error {
	creds := credentialFlags{getenv: e.getenv}
	fs := newFlagSet("resume", resumeSynopsis, e)
	path := fs.String("journal", "", "journal `FILE`, or postgres://... (a journal a fleet shares: resend what no live worker holds)")
	creds.register(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "timeout of one attempt")
	attempts := fs.Int("attempts", 0, "attempts per operation, the first included; 0 means idemhttp's default (4)")
	grace := fs.Duration("grace", 10*time.Second, "after SIGINT or SIGTERM, how long the operation in flight may take to finish")
	prog := fs.String("progress", "auto", "progress on stderr: auto, bar, lines or none")
	perSecond := fs.Float64("rate", 0, "requests per second at most, retries included; 0: no limit")
	concurrency := fs.Int("concurrency", 16, "entries resent at once")
	retention := retentionFlag(fs)
	maxRetryAfter := maxRetryAfterFlag(fs)
	var fleet fleetFlags
	fleet.register(fs)
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := fleet.check(*path, set); err != nil {
		return err
	}
	switch {
	case len(rest) > 0:
		return fail(exitUsage, "unexpected argument %q", rest[0])
	case *concurrency < 1:
		return fail(exitUsage, "-concurrency must be at least 1")
	case *timeout <= 0:
		return fail(exitUsage, "-timeout must be positive")
	case *attempts < 0:
		return fail(exitUsage, "-attempts must not be negative")
	case *grace < 0:
		return fail(exitUsage, "-grace must not be negative")
	case *maxRetryAfter < 0:
		return fail(exitUsage, "-max-retry-after must not be negative")
	case *prog != "auto" && *prog != "bar" && *prog != "lines" && *prog != "none":
		return fail(exitUsage, "-progress must be auto, bar, lines or none")
	case *perSecond < 0 || math.IsNaN(*perSecond) || math.IsInf(*perSecond, 0):
		return fail(exitUsage, "-rate must be a number of requests per second, 0 for no limit")
	}
	if err := creds.check(); err != nil {
		return err
	}
	if err := checkRetention(*retention); err != nil {
		return err
	}
	if isPostgresURL(*path) {
		return runFleetResume(ctx, e, runnerConfig{
			name: "resume", path: redactDSN(*path), concurrency: *concurrency, timeout: *timeout,
			attempts: *attempts, creds: &creds, progress: *prog, env: e, rate: *perSecond, retention: *retention,
			maxRetryAfter: *maxRetryAfter,
		}, fleet, *path, *grace)
	}
	fj, err := openJournal(*path, true)
	if err != nil {
		return err
	}
	defer fj.Close()
	pending, err := fj.Pending(context.Background())
	if err != nil {
		return describeJournalErr(*path, err)
	}
	r := newRunner(runnerConfig{
		name: "resume", path: *path, fj: fj, concurrency: *concurrency, timeout: *timeout,
		attempts: *attempts, creds: &creds, progress: *prog, total: len(pending), env: e, rate: *perSecond,
		retention: *retention, maxRetryAfter: *maxRetryAfter,
	})
	defer r.close()
	opCtx, stop := r.watch(ctx, *grace)
	defer stop()
	if _, err := r.resume(opCtx); err != nil {
		return err
	}
	stop()
	return r.summary(ctx, len(pending), 0)
}

const inspectSynopsis = `Usage: idemctl inspect -journal FILE [-json] KEY|OPERATION

Shows one journal entry, found by its idempotency key or its operation id:
state, method, URL, times, attempts, last status, the stored headers and
body. Credentials are never stored in the journal, so never shown.
Exit code 1 when no entry matches.
`

func inspectCommand(_ context.Context, args []string, e env) error {
	fs := newFlagSet("inspect", inspectSynopsis, e)
	path := fs.String("journal", "", "journal `FILE`")
	asJSON := fs.Bool("json", false, "print the entry as JSON")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		fmt.Fprint(e.stderr, inspectSynopsis)
		return fail(exitUsage, "want exactly one KEY or OPERATION")
	}
	fj, err := openJournalReadOnly(*path)
	if err != nil {
		return err
	}
	defer fj.Close()
	en, err := findEntry(fj, rest[0])
	if err != nil {
		if errors.Is(err, idemhttp.ErrNotFound) {
			return fail(exitFailed, "no entry with key or operation %q in %s", rest[0], *path)
		}
		return describeJournalErr(*path, err)
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(viewEntry(en, true)); err != nil {
			return fail(exitFailed, "write: %v", err)
		}
		return nil
	}
	return writeEntry(e.stdout, en, time.Now())
}

// findEntry returns the entry whose key, or else operation id, is s.
func findEntry(fj *filejournal.Journal, s string) (*idemhttp.Entry, error) {
	ctx := context.Background()
	en, err := fj.Get(ctx, s)
	if err == nil || !errors.Is(err, idemhttp.ErrNotFound) {
		return en, err
	}
	entries, err := fj.Entries(ctx)
	if err != nil {
		return nil, err
	}
	for _, en := range entries {
		if en.Operation == s {
			return en, nil
		}
	}
	return nil, fmt.Errorf("inspect %s: %w", s, idemhttp.ErrNotFound)
}

// writeEntry prints one entry for a person.
func writeEntry(w io.Writer, en *idemhttp.Entry, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("key", en.Key)
	if en.Operation != "" {
		row("operation", en.Operation)
	}
	row("state", string(en.State))
	if parked(en) {
		row("not before", notBeforeText(now, en.NotBefore)+": the server asked to come back then; nothing sends it before")
	}
	if toReconcile(en) {
		row("reconcile", "its final answer was a server error the server stored and replays; it may have run in part: check the server's own records (see idemctl pending -h)")
	}
	row("method", en.Method)
	row("url", en.URL)
	row("created", fmt.Sprintf("%s (%s ago)", en.Created.Format(time.RFC3339), age(now, en.Created)))
	row("updated", fmt.Sprintf("%s (%s ago)", en.Updated.Format(time.RFC3339), age(now, en.Updated)))
	if a := attemptsText(en); a == "?" {
		row("attempts", "unknown: none recorded yet (attempts are recorded with an outcome; its requests may have been sent by a run that died before learning it)")
	} else {
		row("attempts", a)
	}
	if en.LastStatus != 0 {
		row("last status", fmt.Sprint(en.LastStatus))
	}
	row("fingerprint", en.Fingerprint)
	names := make([]string, 0, len(en.Header))
	for k := range en.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		row("header", k+": "+strings.Join(en.Header[k], ", "))
	}
	switch {
	case en.Body == nil:
		row("body", "(none stored)")
	case printable(en.Body):
		row("body", string(en.Body))
	default:
		row("body (base64)", base64.StdEncoding.EncodeToString(en.Body))
	}
	if err := tw.Flush(); err != nil {
		return fail(exitFailed, "write: %v", err)
	}
	return nil
}

// printable reports whether b is UTF-8 text without control characters
// other than tab, so printing it cannot corrupt a terminal.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\t' {
			return false
		}
	}
	return true
}

// entryView is an entry as JSON output shows it.
type entryView struct {
	Operation   string          `json:"operation,omitempty"`
	Key         string          `json:"key"`
	State       idemhttp.State  `json:"state"`
	Method      string          `json:"method"`
	URL         string          `json:"url"`
	Created     time.Time       `json:"created"`
	Updated     time.Time       `json:"updated"`
	Attempts    int             `json:"attempts"`
	LastStatus  int             `json:"status,omitempty"`
	Reconcile   bool            `json:"reconcile,omitempty"`  // done with a stored server error: see toReconcile
	NotBefore   *time.Time      `json:"not_before,omitempty"` // parked: sent again only from then on
	Fingerprint string          `json:"fingerprint"`
	Header      http.Header     `json:"header,omitempty"`
	Body        json.RawMessage `json:"body,omitempty"`        // a JSON body, as is
	BodyText    string          `json:"body_text,omitempty"`   // another printable body
	BodyBase64  []byte          `json:"body_base64,omitempty"` // any other body
}

func viewEntry(en *idemhttp.Entry, withBody bool) entryView {
	v := entryView{
		Operation: en.Operation, Key: en.Key, State: en.State, Method: en.Method, URL: en.URL,
		Created: en.Created, Updated: en.Updated, Attempts: en.Attempts, LastStatus: en.LastStatus,
		Fingerprint: en.Fingerprint, Header: en.Header, Reconcile: toReconcile(en),
	}
	if parked(en) {
		nb := en.NotBefore
		v.NotBefore = &nb
	}
	switch {
	case !withBody || len(en.Body) == 0:
	case json.Valid(en.Body):
		v.Body = en.Body
	case printable(en.Body):
		v.BodyText = string(en.Body)
	default:
		v.BodyBase64 = en.Body
	}
	return v
}
