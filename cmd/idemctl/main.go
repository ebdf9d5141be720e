// Idemctl runs HTTP operations so that retrying them, and rerunning a
// batch after a crash, never performs an operation twice.
//
// Usage:
//
//	idemctl demo    [flags]                 faults, a crash and a resume, side by side with net/http and go-retryablehttp
//	idemctl serve   [-addr HOST:PORT] [fault flags]  the fake payments API, to try batch (or anything) against
//	idemctl batch   -url URL -in FILE -journal FILE [flags]
//	idemctl pending -journal FILE [-json] [-all]
//	idemctl resume  -journal FILE [-header 'Name: value' ...]
//	idemctl prune   -journal FILE [-retention 24h | -older D] [-dry-run] [-include-pending]
//	idemctl inspect -journal FILE [-json] KEY|OPERATION
//	idemctl verify  -journal FILE [-json] [-repair]
//
// Exit codes: 0 success; 1 some operations failed or stay pending (pending
// lists some, inspect found nothing); 2 usage error; 3 journal or key file
// error (missing, locked, damaged); 4 input error (unreadable file,
// malformed lines); 5 the server was never reached; 6 batch refused to run
// and sent nothing (the input names operations pruned from the journal);
// 130 stopped by SIGINT or SIGTERM, with every operation in flight
// recorded: rerun the same command to finish.
//
// See README.md beside this file for the batch input format and examples.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"golang.org/x/term"
)

// Exit codes, documented in the package comment, the usage text and
// README.md; scripts depend on them, so they never change meaning.
const (
	exitOK          = 0   // every operation succeeded
	exitFailed      = 1   // some operations failed or stay pending; inspect found nothing
	exitUsage       = 2   // bad command line
	exitJournal     = 3   // the journal is missing, locked or damaged
	exitInput       = 4   // the input file is unreadable or has malformed lines
	exitUnreachable = 5   // no operation got any response from the server
	exitRefused     = 6   // batch refused to run; nothing was sent
	exitInterrupted = 130 // SIGINT or SIGTERM; in-flight operations were recorded
)

// exitError is an error that ends a command with a given exit code. A nil
// err ends it silently: the command already reported what happened.
type exitError struct {
	code int
	err  error
}

// Error returns the message, or the exit status when there is none.
func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

// Unwrap returns the underlying error.
func (e *exitError) Unwrap() error { return e.err }

// fail returns an error that exits with code after printing the message.
func fail(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// env is what a command may use of its process. main passes the real
// one; tests run commands in-process with buffers and a fake environment.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
	// isTerminal reports whether w is a terminal, which decides between
	// a progress bar and plain progress lines.
	isTerminal func(w io.Writer) bool
	// wrapJournal, when set, wraps the journal batch opens: a test seam
	// that counts the journal's reads. nil in production.
	wrapJournal func(batchJournal) batchJournal
}

func main() {
	// The first SIGINT or SIGTERM cancels ctx: commands stop starting
	// operations and let the ones in flight record their outcome. After
	// it, the default action is restored, so a second Ctrl-C ends the
	// process at once; the journal makes even that safe.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], env{
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
		getenv:     os.Getenv,
		isTerminal: isTerminal,
	})
	stop()
	os.Exit(code)
}

// isTerminal reports whether w is a file attached to a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// commands maps each subcommand to its function. A cancelled ctx means a
// signal arrived.
var commands = map[string]func(ctx context.Context, args []string, e env) error{
	"demo":    demoCommand,
	"serve":   serveCommand,
	"batch":   batchCommand,
	"pending": pendingCommand,
	"resume":  resumeCommand,
	"prune":   pruneCommand,
	"inspect": inspectCommand,
	"verify":  verifyCommand,
}

// run executes the command line args (without the program name) and
// returns the exit code.
func run(ctx context.Context, args []string, e env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.stdout, usage)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(e.stdout, version())
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "idemctl: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	err := cmd(ctx, args[1:], e)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// Every command returns exitErrors; anything else is a bug, and
		// not one to hide behind a misleading code.
		fmt.Fprintf(e.stderr, "idemctl %s: %v\n", args[0], err)
		return exitFailed
	}
	if ee.err != nil {
		fmt.Fprintf(e.stderr, "idemctl %s: %v\n", args[0], ee.err)
	}
	return ee.code
}

// version describes this build: idemctl's module version, the idemhttp
// it was built with, and the Go release, from the binary's build
// information ("(devel)" for a build from a work tree).
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "idemctl (unknown version)"
	}
	lib := "unknown"
	for _, d := range bi.Deps {
		if d.Path == "github.com/idemkit/idemhttp" {
			lib = d.Version
			if d.Replace != nil {
				lib += " => " + d.Replace.Path
			}
		}
	}
	return fmt.Sprintf("idemctl %s (idemhttp %s, %s)", cmp.Or(bi.Main.Version, "(devel)"), lib, bi.GoVersion)
}

const usage = `idemctl: run HTTP operations so that retries and reruns never perform one twice

Usage:
  idemctl demo    [flags]       show faults, a crash and a resume: idemhttp beside net/http and go-retryablehttp
  idemctl serve   [-addr HOST:PORT] [fault flags]
                                run the fake payments API (with faults) until Ctrl-C, printing what it counts
  idemctl batch   -url URL -in FILE -journal FILE [flags]
                                send one request per input line, resumably
  idemctl pending -journal FILE list operations whose outcome is not known yet
  idemctl resume  -journal FILE resend pending operations with their keys
  idemctl prune   -journal FILE delete done entries older than -retention (24h); -dry-run lists them
  idemctl inspect -journal FILE KEY|OPERATION
                                show one journal entry
  idemctl verify  -journal FILE [-repair]
                                check the journal; -repair salvages a damaged one

Run 'idemctl COMMAND -h' for a command's flags; 'idemctl --version' for the version.

Exit codes:
  0    success
  1    some operations failed or stay pending; pending listed some; inspect found no entry
  2    usage error
  3    journal or key file error: missing, locked by another process, or damaged
  4    input error: unreadable input file or malformed lines (listed; the valid
       lines still ran, unless none was valid: then nothing was sent)
  5    the server was never reached (connection refused, unknown host)
  6    batch refused to run, nothing sent: the input names operations pruned
       from the journal (see batch -pruned)
  130  stopped by SIGINT or SIGTERM; operations in flight were recorded:
       rerun the same command to finish
`
