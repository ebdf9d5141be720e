package idemserver_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp/idemserver"
)

func TestResponseBinaryRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		give idemserver.Response
	}{
		{"minimal", idemserver.Response{Status: 204}},
		{"headers and body", idemserver.Response{
			Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a=1", "b=2"}, "X-Empty": {""}},
			Body:   []byte(`{"id":"ch_1"}`),
		}},
		{"binary body", idemserver.Response{Status: 200, Body: []byte{0, 1, 0xff, 0x80}}},
		{"large body", idemserver.Response{Status: 200, Body: bytes.Repeat([]byte("z"), 70000)}},
		{"many headers", idemserver.Response{Status: 200, Header: http.Header{
			"A": {"1"}, "B": {"2"}, "C": {"3"}, "D": {"4"}, "E": {"5"}, "F": {"6"}, "G": {"7"}, "H": {"8"}, "I": {"9"},
			"J": {"10"}, "K": {"11"}, "L": {"12"}, "M": {"13"}, "N": {"14"}, "O": {"15"}, "P": {"16"}, "Q": {"17"},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := tt.give.MarshalBinary()
			require.NoError(t, err)
			var got idemserver.Response
			require.NoError(t, got.UnmarshalBinary(b))
			assert.Equal(t, tt.give, got)

			again, err := got.MarshalBinary()
			require.NoError(t, err)
			assert.Equal(t, b, again, "the encoding is deterministic")
		})
	}
}

func TestResponseMarshalRefusesBadStatus(t *testing.T) {
	for _, status := range []int{0, 99, 1000, -1} {
		_, err := (&idemserver.Response{Status: status}).MarshalBinary()
		assert.Error(t, err, "status %d", status)
	}
}

func TestResponseUnmarshalRejectsCorrupt(t *testing.T) {
	valid, err := (&idemserver.Response{Status: 200, Header: http.Header{"K": {"v"}}, Body: []byte("body")}).MarshalBinary()
	require.NoError(t, err)
	tests := []struct {
		name string
		give []byte
	}{
		{"empty", nil},
		{"unknown format", append([]byte{9}, valid[1:]...)},
		{"truncated head", valid[:5]},
		{"no status", []byte{1}},
		{"status too low", []byte{1, 5, 0}},
		{"status too high", []byte{1, 0xe8, 0x07, 0}},
		{"header count beyond input", []byte{1, 200, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"value count beyond input", []byte{1, 200, 1, 1, 'K', 0xff, 0x7f}},
		{"name length beyond input", []byte{1, 200, 1, 1, 9, 'K'}},
		{"varint overflow", append([]byte{1}, bytes.Repeat([]byte{0xff}, 11)...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := idemserver.Response{Status: 418, Body: []byte("untouched")}
			assert.Error(t, r.UnmarshalBinary(tt.give))
			assert.Equal(t, idemserver.Response{Status: 418, Body: []byte("untouched")}, r, "a failed decode leaves r alone")
		})
	}
}

func TestResponseUnmarshalCopies(t *testing.T) {
	b, err := (&idemserver.Response{Status: 200, Body: []byte("body")}).MarshalBinary()
	require.NoError(t, err)
	var r idemserver.Response
	require.NoError(t, r.UnmarshalBinary(b))
	copy(b[len(b)-4:], "XXXX")
	assert.Equal(t, "body", string(r.Body))
}

// FuzzResponseUnmarshal decodes arbitrary bytes: no panic, and whatever
// decodes re-encodes to something that decodes to the same response.
func FuzzResponseUnmarshal(f *testing.F) {
	for _, r := range []idemserver.Response{
		{Status: 200},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Set-Cookie": {"a", "b"}}, Body: []byte("{}")},
		{Status: 999, Body: []byte(strings.Repeat("x", 300))},
	} {
		b, err := r.MarshalBinary()
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{1, 200, 1, 1, 'K', 0xff, 0x7f})
	f.Add([]byte{1, 200, 1, 2, 1, 'K', 0, 1, 'a', 0}) // duplicate name
	f.Fuzz(func(t *testing.T, data []byte) {
		var r idemserver.Response
		if r.UnmarshalBinary(data) != nil {
			return
		}
		b, err := r.MarshalBinary()
		require.NoError(t, err)
		var again idemserver.Response
		require.NoError(t, again.UnmarshalBinary(b))
		require.Equal(t, r, again)
	})
}

// TestResponseEncodingIsExact: the record is allocated at its exact size,
// since a store may keep it for a day.
func TestResponseEncodingIsExact(t *testing.T) {
	for _, r := range []idemserver.Response{
		{Status: 200},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X": {strings.Repeat("v", 200), ""}}, Body: bytes.Repeat([]byte("b"), 20000)},
	} {
		b, err := r.MarshalBinary()
		require.NoError(t, err)
		assert.Equal(t, len(b), cap(b))
	}
}
