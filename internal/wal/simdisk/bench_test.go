package simdisk_test

import (
	"math/rand/v2"
	"testing"

	"github.com/idemkit/idemhttp/internal/wal"
	"github.com/idemkit/idemhttp/internal/wal/simdisk"
)

// BenchmarkCrashReopen measures one crash/reopen cycle of the log on the
// simulated disk: a log of 100 batches (a copy of one disk), opened and
// replayed, one batch committed, the power cut in the middle of the next
// commit's write, a crash keeping a torn prefix of it, and the open that
// cuts the torn tail off and keeps it aside. cycles/s is the rate.
//
//	go test -run '^$' -bench CrashReopen -count 5 ./internal/wal/simdisk
func BenchmarkCrashReopen(b *testing.B) {
	base := simdisk.New(&simdisk.Options{Torn: simdisk.TornByte})
	l, err := wal.Open("/j/log", &wal.Options{FS: base}, nopApply)
	if err != nil {
		b.Fatal(err)
	}
	for range 100 {
		commitPayload(b, l, "a record of about sixty bytes, as a small journal entry is")
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		d := base.Clone()
		l, err := wal.Open("/j/log", &wal.Options{FS: d}, nopApply)
		if err != nil {
			b.Fatal(err)
		}
		commitPayload(b, l, "one more")
		d.HaltAt(1)
		bt, _, err := l.Append(wal.RecordHeaderLen+8, 1, func(buf []byte) []byte { return wal.AppendRecord(buf, []byte("cut off!")) })
		if err != nil {
			b.Fatal(err)
		}
		<-bt.Done()
		_ = l.Close()
		d.Crash(rng)
		l, err = wal.Open("/j/log", &wal.Options{FS: d}, nopApply)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

func nopApply(int64, int, []byte) error { return nil }

func commitPayload(b *testing.B, l *wal.Log, p string) {
	bt, _, err := l.Append(wal.RecordHeaderLen+len(p), 1, func(buf []byte) []byte { return wal.AppendRecord(buf, []byte(p)) })
	if err != nil {
		b.Fatal(err)
	}
	<-bt.Done()
	if err := bt.Err(); err != nil {
		b.Fatal(err)
	}
}
