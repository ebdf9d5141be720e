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

Lists the journal's entries that need attention: pending (the outcome is
unknown; idemctl resume or rerunning the batch resends them with their keys)
and abandoned (pending longer than the server keeps keys: check by hand).
A table by default; -json prints one JSON object per line (bodies left out:
see idemctl inspect). Attempts are recorded with an outcome, so a pending
entry a killed run left behind shows ? attempts (0 in JSON): its request
may have been sent.

Exit codes: 0 nothing pending or abandoned; 1 some entries are pending or
abandoned (listed); 2 usage; 3 journal error. So a script can wait for
a journal to settle: idemctl pending -journal FILE >/dev/null && echo settled
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
		entries = slices.DeleteFunc(entries, func(en *idemhttp.Entry) bool { return en.State == idemhttp.StateDone })
	}
	unsettled := 0
	for _, en := range entries {
		if en.State != idemhttp.StateDone {
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
		return fail(exitFailed, "%d entries pending or abandoned in %s", unsettled, *path)
	}
	return nil
}

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

// writeTable prints entries as an aligned table.
func writeTable(w io.Writer, entries []*idemhttp.Entry, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tKEY\tMETHOD\tURL\tAGE\tATTEMPTS\tSTATUS\tSTATE")
	unknown := false
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			op, en.Key, en.Method, en.URL, age(now, en.Created), attempts, status, en.State)
	}
	if err := tw.Flush(); err != nil {
		return fail(exitFailed, "write: %v", err)
	}
	if unknown {
		if _, err := fmt.Fprintln(w, unknownAttemptsNote); err != nil {
			return fail(exitFailed, "write: %v", err)
		}
	}
	return nil
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
		retention: *retention,
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
		Fingerprint: en.Fingerprint, Header: en.Header,
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
