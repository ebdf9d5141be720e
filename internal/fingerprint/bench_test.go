package fingerprint

import (
	"strconv"
	"strings"
	"testing"
)

// canonBodies are two JSON bodies of about 1 MB with the same 999
// members, each with a string of 1000 bytes, out of order at every level:
// flat, all in one object, and nested999, each object holding the next,
// 999 deep.
func canonBodies() (flat, nested []byte) {
	filler := strings.Repeat("x", 1000)
	var f strings.Builder
	f.WriteByte('{')
	for i := 999; i > 0; i-- {
		if i < 999 {
			f.WriteByte(',')
		}
		f.WriteString(`"k` + strconv.Itoa(i) + `":"` + filler + `"`)
	}
	f.WriteByte('}')
	var n strings.Builder
	for range 999 {
		n.WriteString(`{"z":"` + filler + `","n":`)
	}
	n.WriteString(`0`)
	for range 999 {
		n.WriteString(`,"a":1}`)
	}
	return []byte(f.String()), []byte(n.String())
}

// BenchmarkCanonicalJSON compares the canonical form of a flat body with
// that of a body of the same size nested 999 deep: the form must cost
// time linear in the body, whatever its depth.
//
//	go test -run '^$' -bench BenchmarkCanonicalJSON -count 5 ./idemserver
func BenchmarkCanonicalJSON(b *testing.B) {
	flat, nested := canonBodies()
	for _, bb := range []struct {
		name string
		body []byte
	}{{"flat", flat}, {"nested999", nested}} {
		b.Run(bb.name, func(b *testing.B) {
			if _, ok := canonicalJSONSum(bb.body, true); !ok {
				b.Fatal("refused")
			}
			b.SetBytes(int64(len(bb.body)))
			b.ReportAllocs()
			for b.Loop() {
				canonicalJSONSum(bb.body, true)
			}
		})
	}
}
