//go:build linux

package wal

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
)

// BenchmarkLogCommit measures a commit through the whole log: Append of
// one record of size bytes and a wait for its batch, from one caller
// (each Append its own commit: one synchronous write) and from 64 (group
// commit). It is the hot path the file-system seam sits on, so it is run
// beside the same code before a change to the seam. cpu-µs/op is the
// process's CPU per op (see BenchmarkCommitWrite), steadier than ns/op on
// a shared machine.
//
//	go test -run '^$' -bench LogCommit -count 5 ./internal/wal
func BenchmarkLogCommit(b *testing.B) {
	for _, concurrency := range []int{1, 64} {
		for _, size := range []int{1300} {
			b.Run(fmt.Sprintf("c%d/size=%d", concurrency, size), func(b *testing.B) {
				l, err := Open(filepath.Join(b.TempDir(), "log"), nil, func(int64, int, []byte) error { return nil })
				if err != nil {
					b.Fatal(err)
				}
				defer func() {
					if err := l.Close(); err != nil {
						b.Fatal(err)
					}
				}()
				payload := make([]byte, size)
				commit := func() error {
					bt, _, err := l.Append(RecordHeaderLen+size, 1, func(buf []byte) []byte {
						return AppendRecord(buf, payload)
					})
					if err != nil {
						return err
					}
					<-bt.Done()
					return bt.Err()
				}
				b.ReportAllocs()
				cpu0 := benchCPU()
				b.ResetTimer()
				if concurrency == 1 {
					for range b.N {
						if err := commit(); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					procs := runtime.GOMAXPROCS(0)
					b.SetParallelism((concurrency + procs - 1) / procs)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if err := commit(); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.StopTimer()
				b.ReportMetric(float64((benchCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// BenchmarkLogOpen measures Open's replay of a file of 50 000 records of
// 100 bytes (in batches of 100), and the close after it: the read path
// through the file-system seam.
//
//	go test -run '^$' -bench LogOpen -count 5 ./internal/wal
func BenchmarkLogOpen(b *testing.B) {
	path := filepath.Join(b.TempDir(), "log")
	l, err := Open(path, nil, func(int64, int, []byte) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 100)
	for range 500 {
		var last *Batch
		for range 100 {
			bt, _, err := l.Append(RecordHeaderLen+len(payload), 1, func(buf []byte) []byte {
				return AppendRecord(buf, payload)
			})
			if err != nil {
				b.Fatal(err)
			}
			last = bt
		}
		<-last.Done()
		if err := last.Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := benchCPU()
	b.ResetTimer()
	for range b.N {
		n := 0
		l, err := Open(path, nil, func(int64, int, []byte) error { n++; return nil })
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		if n < 50_000 {
			b.Fatalf("replayed %d records", n)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((benchCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}
