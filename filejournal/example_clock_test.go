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

// A clock set back while the machine's uptime clock runs on is measured:
// the journal's clock goes on from where it was, and an entry's age stays
// the time that passed. (The clocks here are a test's: Clock is the wall
// clock, which anyone can set, Uptime the one only time moves.)
func ExampleJournal_Now() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	wall := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	up := 10 * time.Hour
	j, err := filejournal.Open(filepath.Join(dir, "journal"), &filejournal.Options{
		Clock:         func() time.Time { return wall },
		Uptime:        func() (string, time.Duration) { return "boot-1", up },
		PruneInterval: -1,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	_, err = j.Begin(ctx, &idemhttp.Entry{
		Key: "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f", Method: http.MethodPost,
		URL: "https://api.example.com/v1/charges",
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	wall, up = wall.Add(time.Hour), up+time.Hour // an hour passes
	wall = wall.Add(-3 * time.Hour)              // the clock is set back 3 h
	now, err := j.Now(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := j.Get(ctx, "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("the machine's clock:", wall.Format(time.TimeOnly))
	fmt.Println("the journal's clock:", now.Format(time.TimeOnly))
	fmt.Println("the entry's age:", now.Sub(e.Created))
	// Output:
	// the machine's clock: 10:00:00
	// the journal's clock: 13:00:00
	// the entry's age: 1h0m0s
}

// A clock found below the latest time the journal holds, with nothing
// to tell how far it went back (no uptime clock here, as after a
// reboot), makes every entry created up to that time of unknown age, for
// good: Client.Resume resends none of them (ErrClockJump), also once the
// clock has passed that time again.
func ExampleJournal_ClockDoubt() {
	dir, err := os.MkdirTemp("", "journal")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	wall := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	j, err := filejournal.Open(filepath.Join(dir, "journal"), &filejournal.Options{
		Clock:         func() time.Time { return wall },
		Uptime:        func() (string, time.Duration) { return "", 0 }, // none
		PruneInterval: -1,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer j.Close()
	_, err = j.Begin(ctx, &idemhttp.Entry{
		Key: "5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f", Method: http.MethodPost,
		URL: "https://api.example.com/v1/charges",
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	wall = wall.Add(-2 * time.Hour) // set back, and seen
	if _, err := j.Now(ctx); err != nil {
		fmt.Println(err)
		return
	}
	wall = wall.Add(25 * time.Hour) // a day later, past every time the journal holds
	doubt, err := j.ClockDoubt(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("entries of unknown age: created at or before", doubt.Format(time.DateTime))
	results, err := (&idemhttp.Client{Journal: j}).Resume(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range results {
		fmt.Println(r.Entry.Key, "clock jump:", errors.Is(r.Err, idemhttp.ErrClockJump))
	}
	// Output:
	// entries of unknown age: created at or before 2026-03-01 12:00:00
	// 5f0c1d0e-2b1a-4c3d-9e8f-7a6b5c4d3e2f clock jump: true
}
