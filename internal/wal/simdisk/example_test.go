package simdisk_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"

	"github.com/idemkit/idemhttp/internal/wal"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// commit appends one record to l and waits for its batch.
func commit(l *wal.Log, p string) error {
	b, _, err := l.Append(wal.RecordHeaderLen+len(p), 1, func(buf []byte) []byte { return wal.AppendRecord(buf, []byte(p)) })
	if err != nil {
		return err
	}
	<-b.Done()
	return b.Err()
}

// records opens the log at path on d and returns its records.
func records(d *simdisk.Disk, path string) ([]string, error) {
	var got []string
	l, err := wal.Open(path, &wal.Options{FS: d}, func(_ int64, _ int, p []byte) error {
		got = append(got, string(p))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, l.Close()
}

// A log on a simulated disk, the power cut during a commit's write, and
// the log after the crash: what was acknowledged is there, the commit
// that was cut is not.
func Example() {
	disk := simdisk.New(&simdisk.Options{Torn: simdisk.TornSector})
	l, err := wal.Open("/j/log", &wal.Options{FS: disk}, func(int64, int, []byte) error { return nil })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("acknowledged:", commit(l, "first"))
	disk.HaltAt(1) // the power is cut at the disk's next change
	fmt.Println("cut:", errors.Is(commit(l, "second"), simdisk.ErrHalted))
	_ = l.Close() // the process is dead: its close writes nothing

	disk.Crash(rand.New(rand.NewPCG(1, 2))) // which torn prefix of the cut write survives
	got, err := records(disk, "/j/log")
	fmt.Println("after the crash:", got, err)
	// Output:
	// acknowledged: <nil>
	// cut: true
	// after the crash: [first] <nil>
}

// A full disk on the log's second write: the commit fails with ENOSPC,
// and writes stop, since the file's tail is unknown.
func ExampleFailNth() {
	disk := simdisk.New(nil)
	disk.SetFault(simdisk.FailNth(simdisk.OpWrite, 2, syscall.ENOSPC)) // the first is the file's header
	l, err := wal.Open("/j/log", &wal.Options{FS: disk}, func(int64, int, []byte) error { return nil })
	if err != nil {
		fmt.Println(err)
		return
	}
	err = commit(l, "first")
	fmt.Println("full:", errors.Is(err, syscall.ENOSPC))
	fmt.Println("stopped:", errors.Is(l.Writable(), syscall.ENOSPC))
	_ = l.Close()
	// Output:
	// full: true
	// stopped: true
}
