package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// newFlagSet returns a flag set that reports errors instead of exiting.
// Its usage (the command's synopsis, then its flags) goes to stdout when
// asked for with -h, as the answer to a question. After a bad flag, stderr
// gets the error and one line pointing at -h, not the whole usage: a
// hundred lines of flags would scroll the error out of sight.
func newFlagSet(name, synopsis string, e env) *flag.FlagSet {
	cmd := "idemctl " + name
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	errOut := &flagErrors{w: e.stderr, prefix: cmd + ": "}
	fs.SetOutput(errOut)
	fs.Usage = func() {
		if errOut.wrote {
			fmt.Fprintf(e.stderr, "Run '%s -h' for its flags.\n", cmd)
			return
		}
		fmt.Fprint(e.stdout, synopsis)
		fmt.Fprintln(e.stdout, "\nFlags:")
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(errOut)
	}
	return fs
}

// flagErrors is a flag set's output: the flag package writes to it only to
// report a bad flag, one line per write, just before it calls Usage.
type flagErrors struct {
	w      io.Writer
	prefix string // the command, as every other error of idemctl starts
	wrote  bool
}

// Write notes that an error was reported and passes it on, prefixed.
func (f *flagErrors) Write(p []byte) (int, error) {
	f.wrote = true
	if _, err := io.WriteString(f.w, f.prefix); err != nil {
		return 0, err
	}
	return f.w.Write(p)
}

// parseFlags parses args, allowing flags after positional arguments
// (idemctl inspect KEY -journal FILE), and returns the positional ones. -h
// prints usage and ends the command successfully; any other error is a
// usage error, already printed by the flag package.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &exitError{code: exitOK}
			}
			return nil, &exitError{code: exitUsage}
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		if args[0] == "--" {
			return append(rest, args[1:]...), nil
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// defaultRetention is the -retention of batch, resume and prune: how
// long Stripe keeps an idempotency key, and idemhttp's default
// Policy.Retention.
const defaultRetention = 24 * time.Hour

// retentionFlag adds -retention to fs: the one setting, for batch, resume
// and prune alike, of how long the server keeps keys (issue 23). It goes
// into the client's Policy.Retention, which tells the journal how long to
// keep done entries, and is prune's default cutoff.
func retentionFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("retention", defaultRetention, "how long the server keeps idempotency keys (Stripe: 24h): a pending entry older than this\nis not resent but marked abandoned, done entries are kept this long, and prune's -older defaults to it")
}

// maxRetryAfterFlag adds -max-retry-after to fs, for batch and resume:
// Policy.MaxRetryAfter, the longest wait the server may ask for with
// Retry-After before the operation is parked instead (pending until the
// server's time, which pending shows; resume and reruns send it from then
// on).
func maxRetryAfterFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("max-retry-after", 0, "the longest Retry-After to wait for within a run; a longer one parks the operation until the\nserver's time (idemctl pending shows it; resume and reruns send it from then on). 0: 60s")
}

// checkRetention validates a -retention value.
func checkRetention(d time.Duration) error {
	if d <= 0 {
		return fail(exitUsage, "-retention must be positive")
	}
	return nil
}

// credentialFlags collects -header 'Name: value' and -header-env
// 'Name=VAR'. Every header given this way is treated as a credential: it is
// added by Client.PrepareRequest, after the journal entry is written, and
// listed in Client.SecretHeaders, so it never reaches the journal; and no
// message ever shows its value.
type credentialFlags struct {
	getenv  func(string) string
	headers http.Header
	err     error // the first bad flag, reported after parsing
}

// register adds the -header and -header-env flags to fs.
func (c *credentialFlags) register(fs *flag.FlagSet) {
	fs.Var(headerFlag{c}, "header", "add a request header `'Name: value'`, treated as a credential: never journaled or printed (repeatable)")
	fs.Var(headerEnvFlag{c}, "header-env", "add the request header `Name=VAR`: Name with the value of environment variable VAR, keeping\nsecrets out of the process list; never journaled or printed (repeatable)")
}

// names returns the canonical header names given, for SecretHeaders.
func (c *credentialFlags) names() []string {
	out := make([]string, 0, len(c.headers))
	for k := range c.headers {
		out = append(out, k)
	}
	return out
}

// check returns the first bad -header or -header-env as a usage error.
func (c *credentialFlags) check() error {
	if c.err != nil {
		return &exitError{code: exitUsage, err: c.err}
	}
	return nil
}

// add records one header, or the first error. Errors name the flag and
// the header name at most: the value may be a secret, and a malformed
// flag is exactly where one ends up pasted whole.
func (c *credentialFlags) add(flagName, want, name, value string) {
	if c.err != nil {
		return
	}
	name = strings.TrimSpace(name)
	switch {
	case !validHeaderName(name):
		c.err = fmt.Errorf("-%s: want %s (value not shown)", flagName, want)
		return
	case strings.EqualFold(name, "Idempotency-Key"):
		c.err = fmt.Errorf("-%s %s: idemctl sets the idempotency key itself (see -key-secret-env)", flagName, name)
		return
	case strings.ContainsAny(value, "\r\n\x00"):
		c.err = fmt.Errorf("-%s %s: the value contains a line break or NUL (value not shown)", flagName, name)
		return
	}
	if c.headers == nil {
		c.headers = make(http.Header)
	}
	c.headers.Add(name, strings.TrimSpace(value))
}

// headerFlag is the -header flag, 'Name: value'. Set never fails: the flag package would
// quote the whole argument, secret included, in its error message.
type headerFlag struct{ c *credentialFlags }

// String shows no default: there is none, and a value may be secret.
func (f headerFlag) String() string { return "" }

// Set records one 'Name: value'.
func (f headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		name = "" // reported as malformed without echoing s
	}
	f.c.add("header", "'Name: value'", name, value)
	return nil
}

// headerEnvFlag is the -header-env flag, 'Name=VAR'.
type headerEnvFlag struct{ c *credentialFlags }

// String shows no default.
func (f headerEnvFlag) String() string { return "" }

// Set records one 'Name=VAR', reading VAR now.
func (f headerEnvFlag) Set(s string) error {
	name, v, ok := strings.Cut(s, "=")
	if !ok || v == "" {
		f.c.add("header-env", "'Name=VAR'", "", "")
		return nil
	}
	value := f.c.getenv(v)
	if value == "" && f.c.err == nil {
		f.c.err = fmt.Errorf("-header-env %s: environment variable %s is empty or unset", strings.TrimSpace(name), v)
		return nil
	}
	f.c.add("header-env", "'Name=VAR'", name, value)
	return nil
}

// validHeaderName reports whether s is an HTTP field name: a non-empty
// token (RFC 9110 §5.1).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
