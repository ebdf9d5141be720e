//go:build unix

package filejournal

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/internal/wal"
)

// million enables the 1M-entry scale benchmarks, which write a 1.3 GB
// file and take minutes: go test -bench FileJournalScale -journal.million.
var million = flag.Bool("journal.million", false, "run the FileJournal scale benchmarks at 1M entries too")

// ijScaleFile writes a journal of n entries with 1 KiB bodies straight
// into a file (no syncs, so that building it takes seconds, not hours):
// three in four are done, the rest pending, all last updated an hour
// before now. It returns the file's path.
func ijScaleFile(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "journal.db")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	salt, err := wal.NewSalt()
	if err != nil {
		b.Fatal(err)
	}
	buf := wal.FileHeader(salt)
	var off int64
	seq := uint64(0)
	body := make([]byte, 1024)
	old := time.Now().Add(-time.Hour)
	batch := -1
	flush := func() {
		if batch >= 0 {
			seq++
			wal.SealBatch(buf[batch:], seq, off+int64(batch), salt)
			batch = -1
		}
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		off += int64(len(buf))
		buf = buf[:0]
	}
	for i := range n {
		if batch < 0 {
			batch = len(buf)
			buf = append(buf, make([]byte, wal.BatchHeaderLen)...)
		}
		e := &idemhttp.Entry{
			Operation: fmt.Sprintf("op-%09d", i), Key: fmt.Sprintf("00000000-0000-4000-8000-%012d", i),
			Method: http.MethodPost, URL: "https://api.example.com/v1/charges",
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body,
			Fingerprint: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			Created:     old, Updated: old, State: idemhttp.StatePending,
		}
		if i%4 != 0 {
			e.State = idemhttp.StateDone
		}
		if buf, err = appendBegin(buf, e); err != nil {
			b.Fatal(err)
		}
		if len(buf)-batch > 4<<20 {
			flush()
		}
	}
	flush()
	return path
}

// ijHeap returns the live heap after a full collection.
func ijHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkFileJournalScale opens a journal of n entries (1 KiB bodies,
// three in four done and past the cutoff) with a warm page cache, as
// after a crash (no index file: the whole file is replayed), closes it
// (which writes the index file) and opens it again from the index file,
// then prunes, which compacts the file (and writes its index file),
// while one caller keeps calling Begin, then opens a copy of the result
// as a crash would leave it, and reports:
// open-ms (the replay), heap-B/entry (the index, after opening),
// close-ms, open-index-ms (the open from the index file), prune-ms
// (Prune and the compaction it triggers), max-begin-ms (the slowest
// Begin during the prune), heap-after-prune-B/entry (per entry still
// live) and open-after-prune-ms (the crashed copy, from the compaction's
// index file).
func BenchmarkFileJournalScale(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			if n > 100_000 && !*million {
				b.Skip("1M entries: pass -journal.million")
			}
			path := ijScaleFile(b, n)
			ijCopyFile(b, path, os.DevNull) // warm the page cache
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				cp := path + ".run"
				ijCopyFile(b, path, cp)
				base := ijHeap()
				b.StartTimer()

				start, cpu0 := time.Now(), ijCPU()
				j, err := Open(cp, &Options{PruneInterval: -1})
				if err != nil {
					b.Fatal(err)
				}
				openTime, openCPU := time.Since(start), ijCPU()-cpu0
				heap := ijHeap() - base
				start = time.Now()
				if err := j.Close(); err != nil {
					b.Fatal(err)
				}
				closeTime := time.Since(start)
				start, cpu0 = time.Now(), ijCPU()
				j, err = Open(cp, &Options{PruneInterval: -1})
				if err != nil {
					b.Fatal(err)
				}
				indexTime, indexCPU := time.Since(start), ijCPU()-cpu0
				if !j.Stats().IndexLoaded {
					b.Fatal("the index file was not used")
				}

				var stop atomic.Bool
				var worst atomic.Int64
				var wg sync.WaitGroup
				seq := 0
				begins := func() {
					defer wg.Done()
					for !stop.Load() {
						seq++
						e := &idemhttp.Entry{Key: fmt.Sprintf("new-%d", seq), Method: http.MethodPost, URL: "https://api.example.com/", Body: make([]byte, 1024)}
						t0 := time.Now()
						if _, err := j.Begin(context.Background(), e); err != nil {
							b.Error(err)
							return
						}
						if d := time.Since(t0).Nanoseconds(); d > worst.Load() {
							worst.Store(d)
						}
					}
				}
				// The control: the slowest Begin over a second without a
				// prune, on the same machine at the same time.
				wg.Add(1)
				go begins()
				time.Sleep(time.Second)
				stop.Store(true)
				wg.Wait()
				idle := worst.Swap(0)
				stop.Store(false)
				wg.Add(1)
				go begins()
				start = time.Now()
				pruned, err := j.Prune(context.Background(), time.Now().Add(-time.Minute))
				pruneTime := time.Since(start)
				stop.Store(true)
				wg.Wait()
				if err != nil || pruned != n-(n+3)/4 {
					b.Fatalf("pruned %d, %v", pruned, err)
				}
				after := ijHeap() - base
				b.StopTimer()
				// A crash after the prune: a copy of the file and of the
				// index file the compaction wrote, opened read-only.
				if err := j.Sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				crashed := cp + ".crashed"
				ijCopyFile(b, cp, crashed)
				ijCopyFile(b, cp+indexSuffix, crashed+indexSuffix)
				start = time.Now()
				c, err := Open(crashed, &Options{ReadOnly: true})
				if err != nil {
					b.Fatal(err)
				}
				crashTime := time.Since(start)
				if !c.Stats().IndexLoaded {
					b.Fatal("the compaction's index file was not used")
				}
				_ = c.Close()
				_ = os.Remove(crashed)
				_ = os.Remove(crashed + indexSuffix)
				st := j.Stats()
				if err := j.Close(); err != nil {
					b.Fatal(err)
				}
				_ = os.Remove(cp)
				_ = os.Remove(cp + indexSuffix)
				b.ReportMetric(float64(openTime.Microseconds())/1000, "open-ms")
				b.ReportMetric(float64(openCPU.Microseconds())/1000, "open-cpu-ms")
				b.ReportMetric(float64(closeTime.Microseconds())/1000, "close-ms")
				b.ReportMetric(float64(indexTime.Microseconds())/1000, "open-index-ms")
				b.ReportMetric(float64(indexCPU.Microseconds())/1000, "open-index-cpu-ms")
				b.ReportMetric(float64(heap)/float64(n), "heap-B/entry")
				b.ReportMetric(float64(pruneTime.Microseconds())/1000, "prune-ms")
				b.ReportMetric(float64(crashTime.Microseconds())/1000, "open-after-prune-ms")
				b.ReportMetric(float64(worst.Load())/1e6, "max-begin-ms")
				b.ReportMetric(float64(idle)/1e6, "max-begin-idle-ms")
				b.ReportMetric(float64(after)/float64(n-pruned), "heap-after-prune-B/entry")
				b.ReportMetric(float64(st.Compactions), "compactions")
				b.StartTimer()
			}
		})
	}
}

// ijCPU is the CPU time this process has used, user and system: on a
// shared machine wall time measures the neighbours as much as the code.
func ijCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ijCopyFile(b *testing.B, from, to string) {
	b.Helper()
	src, err := os.Open(from)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		b.Fatal(err)
	}
	// Written back before the timer starts: a warm page cache, not a
	// gigabyte of dirty pages the kernel flushes while the journal opens.
	if to != os.DevNull {
		if err := dst.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
}
