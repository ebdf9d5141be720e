package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// With a journal, every keyed call names its operation: one without a
// name is refused before anything is written or sent, since a rerun of
// the same work after a crash would mint a new key and could charge
// twice. WithOperation (or a key of the caller's own, with WithKey) names
// it; Policy.AllowUnnamed lets unnamed calls through, for work that is
// never rerun.
func ExampleClient_journal() {
	var keys []string
	srv := flaky(0, &keys)
	defer srv.Close()
	dir, _ := os.MkdirTemp("", "journal")
	defer os.RemoveAll(dir)
	j, err := filejournal.Open(filepath.Join(dir, "journal"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	c := &idemhttp.Client{Journal: j}

	send := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{"amount":1000}`))
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	err = send(context.Background())
	fmt.Println(errors.Is(err, idemhttp.ErrInvalidRequest), errors.Is(err, idemhttp.ErrNotSent), "requests sent:", len(keys))
	fmt.Println(send(idemhttp.WithOperation(context.Background(), "invoice-2024-117")), "requests sent:", len(keys))
	// Output:
	// true true requests sent: 0
	// <nil> requests sent: 1
}

// pacer lets an attempt go only while its budget lasts.
type pacer struct{ left int }

func (p *pacer) Wait(ctx context.Context) error {
	if p.left == 0 {
		return errors.New("rate: Wait(n=1) would exceed context deadline")
	}
	p.left--
	return nil
}

func (p *pacer) Observe(int, bool) {}

// A Pacer that refuses an attempt (as golang.org/x/time/rate's Limiter
// does when the token would come after the deadline) stops the call
// before the attempt is sent, and the call says why: it is never
// bypassed.
func ExamplePacer() {
	var keys []string
	srv := flaky(1, &keys) // overloaded once: the retry needs the pacer
	defer srv.Close()
	c := &idemhttp.Client{Policy: &idemhttp.Policy{BaseDelay: time.Millisecond, Pacer: &pacer{left: 1}}}
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"amount":1000}`))
	_, err := c.Do(req)
	var g *idemhttp.GiveUpError
	fmt.Println(errors.Is(err, idemhttp.ErrPacerRefused), errors.As(err, &g) && g.LastStatus == 503, "requests sent:", len(keys))
	// Output: true true requests sent: 1
}
