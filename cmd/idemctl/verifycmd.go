package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

const verifySynopsis = `Usage: idemctl verify -journal FILE [-json] [-repair]

Reads the whole journal again and checks every batch and entry against its
checksum, then reports the entries by state, the file's size and the latest time the
journal has recorded (entries pruned since included), with a warning when
the clock is below it: the clock was set back, and resume refuses to
resend until it passes that time. A journal opened from its index file
(FILE.index, which a clean close or a compaction of a journal of 8 MiB
or more writes) gets that index checked against the whole file too, and
says so. It only reads: it works while
another process writes the journal, and on a read-only mount. If the
journal ends in an incomplete batch (a torn tail), it says so: after a
crash that is most likely a group commit the crash interrupted before any
caller was told it succeeded, but damage to the last batches looks the
same, so the next writer keeps the tail in a FILE.torn-TIME file.

A damaged journal (exit code 3) has lost data that was acknowledged. Restore
it from a backup if there is one. If not, -repair salvages it: it copies the
file byte for byte to FILE.damaged-YYYYMMDDTHHMMSSZ, then rewrites the
journal with only its intact entries. The entries in the damaged part are
gone and their operations may have run; an entry kept may have lost its
latest outcome. Review the pending list (idemctl pending -all) with the
server before rerunning the batch: a rerun sends what the journal forgot as
new operations, under new keys unless the keys are derived
(-key-secret-env). On a healthy journal -repair only verifies: it makes no
copy and rewrites nothing.

Exit codes: 0 healthy or repaired; 2 usage; 3 missing, locked, damaged
(without -repair), or beyond repair.
`

// verifyReport is what verify prints, as text or as one JSON object.
type verifyReport struct {
	Journal string `json:"journal"`
	// Healthy is true when the journal passes Verify: as found, or after
	// a repair.
	Healthy bool   `json:"healthy"`
	Error   string `json:"error,omitempty"` // the damage found, when not repaired
	// Entries counts the entries by state: all of them, or those a repair
	// kept. Nil when the journal is damaged and was not repaired.
	Entries *stateCounts `json:"entries,omitempty"`
	// FileBytes is the file's size. (No "live bytes" beside it: the
	// library's LiveBytes counts each entry's index memory too, 150 bytes
	// apiece, and so exceeded the file of a journal of small entries.)
	FileBytes      int64  `json:"file_bytes"`
	TruncatedBytes int64  `json:"truncated_bytes"` // the torn tail after the last whole batch
	Repaired       bool   `json:"repaired,omitempty"`
	Backup         string `json:"backup,omitempty"`        // the damaged file's copy
	SkippedBytes   int64  `json:"skipped_bytes,omitempty"` // damaged bytes the repair left out
	// HighWater is the latest time the journal has recorded, entries
	// pruned since included ([filejournal.Journal.HighWater]); nil for a
	// journal that recorded none. A clock more than
	// [idemhttp.ClockTolerance] below it makes resume and reruns refuse.
	HighWater *time.Time `json:"high_water,omitempty"`
	// ClockBehind is how far the clock is below HighWater, when it is by
	// more than the tolerance; 0 otherwise.
	ClockBehind time.Duration `json:"clock_behind_ns,omitempty"`
	// IndexFile is true when the journal was opened from the index file
	// its last clean close or compaction wrote beside it
	// ([filejournal.Stats.IndexLoaded]): verify then also checked that
	// index, entry by entry, against the whole file.
	IndexFile bool `json:"index_file,omitempty"`
}

// setHighWater fills in rep's HighWater and ClockBehind from fj, as of
// now.
func setHighWater(ctx context.Context, fj *filejournal.Journal, rep *verifyReport, now time.Time) error {
	mark, err := fj.HighWater(ctx)
	if err != nil || mark.IsZero() {
		return err
	}
	rep.HighWater = &mark
	if d := mark.Sub(now); d > idemhttp.ClockTolerance {
		rep.ClockBehind = d
	}
	return nil
}

// stateCounts counts entries by state.
type stateCounts struct {
	Pending   int `json:"pending"`
	Done      int `json:"done"`
	Abandoned int `json:"abandoned"`
}

func (c stateCounts) String() string {
	return fmt.Sprintf("%d pending, %d done, %d abandoned", c.Pending, c.Done, c.Abandoned)
}

func verifyCommand(_ context.Context, args []string, e env) error {
	// Not fs, as in the other commands: that is io/fs here.
	flags := newFlagSet("verify", verifySynopsis, e)
	path := flags.String("journal", "", "journal `FILE`")
	asJSON := flags.Bool("json", false, "print the report as one JSON object")
	repair := flags.Bool("repair", false, "if the journal is damaged, copy it aside and rewrite it with only its intact entries")
	rest, err := parseFlags(flags, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fail(exitUsage, "unexpected argument %q", rest[0])
	}
	// Like pending and prune, verify ignores the signal context: it sends
	// nothing, and the second Ctrl-C ends it at once, which Compact
	// survives (the old file or the new one stays whole).
	ctx := context.Background()
	rep := verifyReport{Journal: *path}
	damage, err := checkJournal(ctx, *path, &rep)
	if err != nil {
		return err
	}
	switch {
	case damage == nil:
		rep.Healthy = true
		return printReport(e, &rep, *asJSON)
	case !*repair:
		rep.Error = damage.Error()
		if fi, err := os.Stat(*path); err == nil {
			rep.FileBytes = fi.Size()
		}
		if *asJSON {
			if err := printReport(e, &rep, true); err != nil {
				return err
			}
		}
		return describeJournalErr(*path, damage)
	}
	if err := repairJournal(ctx, *path, &rep); err != nil {
		return err
	}
	if err := printReport(e, &rep, *asJSON); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "idemctl verify: warning: the entries in the damaged part of the journal are gone (the damaged file is copied to %s), "+
		"and their operations may have run; an entry kept may have lost its latest outcome.\n"+
		"Review the pending list (idemctl pending -journal %s -all) with the server before rerunning the batch: "+
		"a rerun sends what the journal forgot as new operations.\n", rep.Backup, *path)
	return nil
}

// checkJournal opens the journal at path, verifies it and fills in rep. It
// returns the damage found, wrapping [filejournal.ErrCorrupt], or an
// exitError when the journal cannot be checked at all (missing, locked).
func checkJournal(ctx context.Context, path string, rep *verifyReport) (damage, err error) {
	fj, err := openJournalReadOnly(path)
	if err != nil {
		var de *damageError
		if errors.As(err, &de) {
			return de.err, nil
		}
		return nil, err
	}
	defer fj.Close()
	if err := fj.Verify(ctx); err != nil {
		return corruption(path, err)
	}
	counts, err := countEntries(ctx, fj)
	if err != nil {
		return corruption(path, err)
	}
	st := fj.Stats()
	rep.Entries = &counts
	rep.FileBytes, rep.TruncatedBytes = st.FileBytes, st.TruncatedBytes
	rep.IndexFile = st.IndexLoaded
	if err := setHighWater(ctx, fj, rep, time.Now()); err != nil {
		return nil, describeJournalErr(path, err)
	}
	return nil, nil
}

// corruption sorts an error from an open journal into damage, returned
// as damage, and anything else, returned as the command's error.
func corruption(path string, err error) (damage, _ error) {
	if errors.Is(err, filejournal.ErrCorrupt) {
		return err, nil
	}
	return nil, describeJournalErr(path, err)
}

// countEntries counts fj's entries by state. Reading them all back also
// checks each one's own CRC.
func countEntries(ctx context.Context, fj *filejournal.Journal) (stateCounts, error) {
	entries, err := fj.Entries(ctx)
	if err != nil {
		return stateCounts{}, err
	}
	var c stateCounts
	for _, en := range entries {
		switch en.State {
		case idemhttp.StatePending:
			c.Pending++
		case idemhttp.StateDone:
			c.Done++
		case idemhttp.StateAbandoned:
			c.Abandoned++
		}
	}
	return c, nil
}

// repairJournal copies the damaged journal at path aside, then opens it
// skipping the damaged batches and compacts it, which rewrites the file
// with only the entries that survived, and verifies the result.
func repairJournal(ctx context.Context, path string, rep *verifyReport) error {
	// The writer's lock first: a journal another process has open is not
	// copied nor touched (the check before only read it).
	fj, openErr := openJournalWith(path, true, &filejournal.Options{SkipVerify: true})
	var de *damageError
	if openErr != nil && !errors.As(openErr, &de) {
		return openErr
	}
	backup, err := backupJournal(path, time.Now())
	if err != nil {
		if fj != nil {
			_ = fj.Close()
		}
		return fail(exitJournal, "journal %s is damaged, and copying it aside failed, so it was left as it is: %v", path, err)
	}
	rep.Backup = backup
	// From here on every message names the copy: it is the only record
	// of the entries the repair leaves out.
	if openErr != nil {
		// Damaged beyond what SkipVerify skips (the file header).
		return fail(exitJournal, "journal %s cannot be repaired: %v\nThe damaged file was copied to %s; restore the journal from a backup", path, de.err, backup)
	}
	defer fj.Close()
	// Compact resets SkippedBytes, since the new file holds no damage:
	// read it first.
	st := fj.Stats()
	rep.SkippedBytes, rep.TruncatedBytes = st.SkippedBytes, st.TruncatedBytes
	if err := fj.Compact(ctx); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return fail(exitJournal, "journal %s cannot be repaired on %s, which cannot replace a file that is open: %v\nThe damaged file was copied to %s; nothing else was changed", path, runtime.GOOS, err, backup)
		}
		return fail(exitJournal, "repair journal %s: %v\nThe damaged file was copied to %s", path, err, backup)
	}
	if err := fj.Verify(ctx); err != nil {
		return fail(exitJournal, "journal %s is still damaged after the repair: %v\nThe damaged file was copied to %s", path, err, backup)
	}
	counts, err := countEntries(ctx, fj)
	if err != nil {
		return fail(exitJournal, "journal %s after the repair: %v\nThe damaged file was copied to %s", path, err, backup)
	}
	st = fj.Stats()
	rep.Entries = &counts
	rep.FileBytes = st.FileBytes
	if err := setHighWater(ctx, fj, rep, time.Now()); err != nil {
		return fail(exitJournal, "journal %s after the repair: %v\nThe damaged file was copied to %s", path, err, backup)
	}
	if err := fj.Close(); err != nil {
		return fail(exitJournal, "journal %s after the repair: %v\nThe damaged file was copied to %s", path, err, backup)
	}
	rep.Healthy, rep.Repaired = true, true
	return nil
}

// backupJournal copies the file at path byte for byte to
// path.damaged-YYYYMMDDTHHMMSSZ (now, in UTC), mode 0600, and returns the
// copy's name. It never overwrites a file: a name already taken is an
// error. The copy and its directory entry are synced before it returns:
// the repair that follows renames a new file over the journal, and a crash
// must not leave the damaged bytes nowhere.
func backupJournal(path string, now time.Time) (string, error) {
	name := path + ".damaged-" + now.UTC().Format("20060102T150405Z")
	src, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("%s already exists: move it away, or run again in a second", name)
	}
	if err != nil {
		return "", err
	}
	_, err = io.Copy(dst, src)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(filepath.Dir(name))
	}
	if err != nil {
		_ = os.Remove(name) // ours, created above, and incomplete
		return "", fmt.Errorf("copy to %s: %w", name, err)
	}
	return name, nil
}

// syncDir makes the entries of directory dir durable, after a file was
// created in it. Windows has no such call, nor needs it: NTFS makes a
// file's creation durable with its metadata.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// printReport prints rep on stdout, as text or as one JSON object.
func printReport(e env, rep *verifyReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rep); err != nil {
			return fail(exitFailed, "write: %v", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	row("journal", "%s", rep.Journal)
	switch {
	case rep.Repaired:
		row("state", "repaired: the damaged batches were left out")
		row("backup", "%s (the damaged file, as it was)", rep.Backup)
		row("skipped", "%d damaged bytes", rep.SkippedBytes)
		row("kept", "%s", rep.Entries)
	default:
		row("state", "healthy")
		row("entries", "%s", rep.Entries)
	}
	row("file", "%d bytes", rep.FileBytes)
	if rep.HighWater != nil {
		row("latest time", "%s (the latest time the journal has recorded; resume refuses while the clock is more than %s below it)",
			rep.HighWater.Format(time.RFC3339Nano), idemhttp.ClockTolerance)
	}
	if rep.ClockBehind > 0 {
		row("clock", "%s behind the journal: the clock was set back, and the age of every pending entry is unknown; resume and reruns refuse (clock jumped) until the clock passes the latest time",
			rep.ClockBehind.Round(time.Second))
	}
	if rep.IndexFile {
		row("index file", "%s%s: opened from it, and it matches the whole journal", rep.Journal, ".index")
	}
	if rep.TruncatedBytes > 0 {
		row("torn tail", "%d bytes at the end do not form a whole batch: most likely a group commit that a crash interrupted before any caller was told it succeeded, but damage to the last batches looks the same; the next writer keeps them in a .torn- file beside the journal", rep.TruncatedBytes)
	}
	if err := tw.Flush(); err != nil {
		return fail(exitFailed, "write: %v", err)
	}
	return nil
}
