package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// countingJournal is a caller's metrics decorator: it counts the entries
// begun through it, and reveals the journal it wraps with Unwrap.
type countingJournal struct {
	idemhttp.Journal
	begins atomic.Int64
}

func (c *countingJournal) Begin(ctx context.Context, e *idemhttp.Entry) (*idemhttp.Entry, error) {
	c.begins.Add(1)
	return c.Journal.Begin(ctx, e)
}

// Unwrap returns the journal c wraps.
func (c *countingJournal) Unwrap() idemhttp.Journal { return c.Journal }

// A wrapper around a journal implements Unwrap, so that the Client sees
// the journal behind it: Clients on one journal, each through a wrapper
// of its own, then share its one-sender-per-operation rule, and keep the
// journal's own rules (here a file journal's, one process's: a call that
// provably sent nothing withdraws its entry and says ErrNotSent). Without
// Unwrap the client cannot tell who else sends under the journal's keys,
// and fails closed: the entry stays pending, for Resume, and the error
// does not match ErrNotSent.
func ExampleJournal_wrapper() {
	dir, _ := os.MkdirTemp("", "journal")
	defer os.RemoveAll(dir)
	fj, err := filejournal.Open(filepath.Join(dir, "journal"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fj.Close()
	refused := &http.Client{Transport: &http.Transport{DialContext: func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}}}
	metrics := &countingJournal{Journal: fj}
	c := &idemhttp.Client{Journal: metrics, HTTPClient: refused, Policy: &idemhttp.Policy{MaxAttempts: 1}}

	ctx := idemhttp.WithOperation(context.Background(), "invoice-2024-118")
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://api.example/v1/charges", strings.NewReader(`{"amount":1000}`))
	_, err = c.Do(req)
	pending, _ := fj.Pending(context.Background())
	fmt.Println("not sent:", errors.Is(err, idemhttp.ErrNotSent), "pending:", len(pending), "begins:", metrics.begins.Load())
	// Output:
	// not sent: true pending: 0 begins: 1
}
