package postgres

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzWireValues: the wire's decoding of a statement's first row (keepRow
// keeping its values, value, claimRow and lookupRow reading them) never
// panics on any row a server might send, keeps every value as sent (NULL
// apart from empty), and decodes a claim row exactly when it has three
// values of the claim's binary forms. The input is a row: per value, a
// byte 0xff for NULL, or a length byte and that many bytes. Its corpus
// entry empty-not-null is the failure it found: value read an empty value
// as NULL when it was the row's first bytes (a completed row's record
// would have been taken for a claim in progress); checked to fail with
// value's case for an empty value dropped.
func FuzzWireValues(f *testing.F) {
	f.Add([]byte{1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 7, 6, 0, 0, 0, 1, 0, 2})     // a claim that took the key
	f.Add([]byte{1, 0, 8, 0, 0, 0, 0, 0, 0, 0, 7, 0xff})                    // a claim that did not
	f.Add([]byte{3, 't', 'o', 'k', 2, 'f', 'p', 0xff})                      // a claim row, in progress
	f.Add([]byte{3, 't', 'o', 'k', 2, 'f', 'p', 0, 1, 2, 3, 4, 5, 6, 7, 8}) // too many columns
	f.Add([]byte{1, 2, 8, 0, 0, 0, 0, 0, 0, 0, 7, 5, 0, 0, 0, 1, 0})        // bad bool, short tid
	f.Fuzz(func(t *testing.T, data []byte) {
		var values [][]byte
		for i := 0; i < len(data); {
			n := int(data[i])
			i++
			if n == 0xff {
				values = append(values, nil)
				continue
			}
			n = min(n, len(data)-i)
			values = append(values, append([]byte{}, data[i:i+n]...))
			i += n
		}
		w := &wireConn{}
		w.start()
		w.res = append(w.res, wireResult{})
		r := &w.res[0]
		w.keepRow(r, values)
		if len(values) <= len(r.off) {
			for j, want := range values {
				got, ok := w.value(r, j, len(values))
				if !ok || (got == nil) != (want == nil) || !bytes.Equal(got, want) {
					t.Fatalf("value %d: %q (ok %v), want %q", j, got, ok, want)
				}
			}
		}
		w.keepRow(r, values) // a second row: decoders must not take it for one
		_, _ = w.lookupRow(r)
		_, _ = w.boolValue(r)
		locked, began, ctid, err := w.claimRow(r)
		valid := len(values) == 3 && len(values[0]) == 1 && values[0][0] <= 1 && len(values[1]) == 8 &&
			(values[2] == nil || len(values[2]) == 6)
		if valid != (err == nil) {
			t.Fatalf("claim row %q: error %v", values, err)
		}
		if err == nil {
			if locked != (values[0][0] == 1) || began != int64(binary.BigEndian.Uint64(values[1])) || ctid.Valid != (values[2] != nil) {
				t.Fatalf("claim row %q: %v %d %v", values, locked, began, ctid)
			}
		}
	})
}

// TestWireStmtsRefuseNUL: a statement holding a NUL byte, which would end
// it early in its Parse message, is never put on the wire: the middleware
// then sends every statement through pgx. Checked to fail with
// newWireStmts's check dropped.
func TestWireStmtsRefuseNUL(t *testing.T) {
	sql := newKeysSQL("public.idemhttp_keys")
	if newWireStmts(sql, "BEGIN") == nil {
		t.Fatal("no statements for a table whose name holds no NUL")
	}
	bad := newKeysSQL(`public."idem` + "\x00" + `"`)
	if newWireStmts(bad, "BEGIN") != nil {
		t.Fatal("statements holding a NUL byte would go on the wire")
	}
}
