package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idemhttp"
)

const pruneSynopsis = `Usage: idemctl prune -journal FILE [-retention 24h | -older D] [-dry-run] [-json] [-include-pending]

Deletes the done entries last updated more than -older ago. -dry-run lists
them and deletes nothing. Pending and abandoned entries are kept, since
nobody knows yet whether they ran, unless -include-pending asks for them too.

Before deleting anything, prune appends each entry (operation, key, state,
status) to FILE.pruned and syncs it. A later batch whose input names one of
those operations refuses to run before sending anything (see batch -pruned):
with the entry gone, the rerun could not tell that the operation ran. Keep
FILE.pruned with the journal; deleting it removes that protection.

-older defaults to -retention (24h, as batch and resume), the retention of
Stripe-style servers, after which the server has forgotten the key anyway.

Exit codes: 0 pruned (or listed, with -dry-run); 2 usage; 3 journal error.
`

func pruneCommand(_ context.Context, args []string, e env) error {
	fs := newFlagSet("prune", pruneSynopsis, e)
	path := fs.String("journal", "", "journal `FILE`")
	older := fs.Duration("older", 0, "prune entries last updated longer ago than this (default: -retention)")
	retention := retentionFlag(fs)
	dryRun := fs.Bool("dry-run", false, "list what would be pruned; delete nothing")
	asJSON := fs.Bool("json", false, "list the entries pruned (or, with -dry-run, those that would be) as JSON lines on stdout;\nwithout it, -dry-run lists them as a table and a real prune lists nothing")
	withPending := fs.Bool("include-pending", false, "prune pending and abandoned entries too: their operations may have run,\nand a rerun will not know their keys unless keys are derived")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	olderSet := false
	fs.Visit(func(f *flag.Flag) { olderSet = olderSet || f.Name == "older" })
	switch {
	case len(rest) > 0:
		return fail(exitUsage, "unexpected argument %q", rest[0])
	case *older < 0:
		return fail(exitUsage, "-older must not be negative")
	}
	if err := checkRetention(*retention); err != nil {
		return err
	}
	if !olderSet {
		*older = *retention
	}
	fj, err := openJournal(*path, true)
	if err != nil {
		return err
	}
	defer fj.Close()
	now := time.Now()
	cutoff := now.Add(-*older)
	entries, err := fj.Entries(context.Background())
	if err != nil {
		return describeJournalErr(*path, err)
	}
	// The same rule as filejournal.Journal.Prune: done and updated before cutoff.
	var doomed []*idemhttp.Entry
	keptPending := 0
	for _, en := range entries {
		switch {
		case !en.Updated.Before(cutoff):
		case en.State == idemhttp.StateDone, *withPending:
			doomed = append(doomed, en)
		default:
			keptPending++
		}
	}
	if *dryRun || *asJSON {
		if err := listEntries(e, doomed, *asJSON, now); err != nil {
			return err
		}
	}
	if keptPending > 0 {
		fmt.Fprintf(e.stderr, "idemctl prune: kept %d pending or abandoned entries older than %s: their outcome is unknown (-include-pending deletes them)\n", keptPending, *older)
	}
	if *dryRun {
		fmt.Fprintf(e.stderr, "idemctl prune: dry run: would prune %d entries last updated more than %s ago\n", len(doomed), *older)
		return nil
	}
	if len(doomed) == 0 {
		fmt.Fprintf(e.stderr, "idemctl prune: nothing to prune\n")
		return nil
	}
	// The record first, synced: if it fails, nothing is pruned.
	if err := appendPruned(*path+prunedSuffix, doomed, now); err != nil {
		return fail(exitJournal, "record pruned operations in %s: %v (nothing pruned)", *path+prunedSuffix, err)
	}
	n, err := fj.Prune(context.Background(), cutoff)
	if err != nil {
		return describeJournalErr(*path, err)
	}
	for _, en := range doomed {
		if en.State == idemhttp.StateDone {
			continue
		}
		if err := fj.Forget(context.Background(), en.Key); err != nil {
			return describeJournalErr(*path, err)
		}
		n++
	}
	fmt.Fprintf(e.stderr, "idemctl prune: pruned %d entries last updated more than %s ago; recorded in %s\n", n, *older, *path+prunedSuffix)
	return nil
}

// listEntries prints entries as a table, or as JSON lines without bodies.
func listEntries(e env, entries []*idemhttp.Entry, asJSON bool, now time.Time) error {
	if !asJSON {
		if len(entries) == 0 {
			return nil
		}
		return writeTable(e.stdout, entries, now)
	}
	enc := json.NewEncoder(e.stdout)
	enc.SetEscapeHTML(false)
	for _, en := range slices.Clone(entries) {
		if err := enc.Encode(viewEntry(en, false)); err != nil {
			return fail(exitFailed, "write: %v", err)
		}
	}
	return nil
}
