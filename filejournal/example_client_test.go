package filejournal_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/filejournal"
)

// Inspection tools open a journal read-only: without the writer's lock,
// so while the writer runs, and without changing the file.
func ExampleOptions_readOnly() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "journal")
	ctx := context.Background()

	w, err := filejournal.Open(path, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Close()
	_, err = w.Begin(ctx, &idemhttp.Entry{
		Operation: "invoice-42", Key: "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f",
		Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	r, err := filejournal.Open(path, &filejournal.Options{ReadOnly: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	e, err := r.Lookup(ctx, "invoice-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.Key, e.State)
	fmt.Println(r.Verify(ctx))
	_, err = r.Begin(ctx, &idemhttp.Entry{Key: "another", Method: http.MethodPost, URL: "https://api.example.com/"})
	fmt.Println(err)
	// Output:
	// 5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f pending
	// <nil>
	// idemhttp: journal begin another: journal is open read-only
}

// The journal remembers the latest time it has recorded, also once the
// entry that held it is gone: a clock set back below it is noticed, and
// Client.Resume resends nothing (ErrClockJump).
func ExampleJournal_HighWater() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	j, err := filejournal.Open(filepath.Join(dir, "journal"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()

	at := time.Now()
	_, err = j.Begin(ctx, &idemhttp.Entry{
		Key: "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f", Method: http.MethodPost,
		URL: "https://api.example.com/v1/charges", Created: at, Updated: at,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	// The entry goes, its time stays.
	if err := j.Delete(ctx, "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f"); err != nil {
		fmt.Println(err)
		return
	}
	mark, err := j.HighWater(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("mark at or after the deleted entry's time:", !mark.Before(at.Truncate(time.Second)))
	clock := at.Add(-2 * time.Hour) // a clock set back 2 h
	fmt.Println("clock behind the journal:", mark.Sub(clock) > idemhttp.ClockTolerance)
	// Output:
	// mark at or after the deleted entry's time: true
	// clock behind the journal: true
}

// An abandoned entry (past the server's retention: its operation may have
// run) keeps its operation's key: a Client's withdrawal (Delete) never
// removes it, so a rerun cannot begin the operation afresh under a new
// key. Once a person has resolved it, the operator removes it with
// Forget.
func ExampleJournal_Forget() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	j, err := filejournal.Open(filepath.Join(dir, "journal"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()

	const key = "0b7e5c1a-8d2f-4e6a-9c3b-1f2e3d4c5b6a"
	if _, err := j.Begin(ctx, &idemhttp.Entry{Operation: "invoice-42", Key: key, Method: http.MethodPost, URL: "https://api.example.com/v1/charges"}); err != nil {
		fmt.Println(err)
		return
	}
	if err := j.Finish(ctx, key, idemhttp.Outcome{State: idemhttp.StateAbandoned, Attempts: 1}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("withdrawal refused:", errors.Is(j.Delete(ctx, key), idemhttp.ErrFenced))
	fmt.Println("forgotten:", j.Forget(ctx, key) == nil)
	_, err = j.Lookup(ctx, "invoice-42")
	fmt.Println("operation gone:", errors.Is(err, idemhttp.ErrNotFound))
	// Output:
	// withdrawal refused: true
	// forgotten: true
	// operation gone: true
}
