package postgres

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
)

func TestResultRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		give *idemhttp.Result
		want *idemhttp.Result
	}{
		{name: "nil", give: nil, want: nil},
		{name: "status only", give: &idemhttp.Result{Status: 204}, want: &idemhttp.Result{Status: 204}},
		{name: "empty body is not no body", give: &idemhttp.Result{Status: 200, Body: []byte{}}, want: &idemhttp.Result{Status: 200, Body: []byte{}}},
		{
			name: "headers and body",
			give: &idemhttp.Result{Status: 201, Header: http.Header{
				"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}, "X-Raw": {"caf\xe9\x00"},
			}, Body: []byte{0, 1, 2, 0xff}},
			want: &idemhttp.Result{Status: 201, Header: http.Header{
				"Content-Type": {"application/json"}, "X-Multi": {"a", "", "c"}, "X-Raw": {"caf\xe9\x00"},
			}, Body: []byte{0, 1, 2, 0xff}},
		},
		{
			name: "no cookie, no empty names",
			give: &idemhttp.Result{Status: 200, Header: http.Header{"Set-Cookie": {"s=1"}, "set-cookie": {"s=2"}, "X-None": {}, "X-One": {"1"}}},
			want: &idemhttp.Result{Status: 200, Header: http.Header{"X-One": {"1"}}},
		},
		{name: "only a cookie", give: &idemhttp.Result{Status: 200, Header: http.Header{"Set-Cookie": {"s=1"}}}, want: &idemhttp.Result{Status: 200}},
		{name: "odd status", give: &idemhttp.Result{Status: -7}, want: &idemhttp.Result{Status: -7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encodeResult(tt.give)
			if tt.give == nil {
				assert.Nil(t, b)
				return
			}
			got, err := decodeResult(b)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestResultMalformed(t *testing.T) {
	valid := encodeResult(&idemhttp.Result{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("xyz")})
	tests := []struct {
		name string
		give []byte
	}{
		{"empty", nil},
		{"unknown version", append([]byte{2}, valid[1:]...)},
		{"truncated", valid[:len(valid)-1]},
		{"trailing byte", append(append([]byte{}, valid...), 0)},
		{"huge header count", []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"huge name", []byte{1, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}},
		{"name without values", []byte{1, 0, 1, 1, 'A', 0, 0}},
		{"a name twice", []byte{1, 0, 2, 1, 'A', 1, 0, 1, 'A', 1, 0, 0}},
		{"body longer than the rest", []byte{1, 0, 0, 5, 'a'}},
		{"status varint too long", []byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeResult(tt.give)
			assert.ErrorIs(t, err, errResult)
		})
	}
}

// FuzzDecodeResult: decoding never panics or over-allocates, and what
// decodes encodes back to the same result (less Set-Cookie and empty
// names, which encodeResult leaves out). Seeds in testdata/fuzz.
func FuzzDecodeResult(f *testing.F) {
	f.Add(encodeResult(&idemhttp.Result{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}))
	f.Add(encodeResult(&idemhttp.Result{Status: 204}))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResult(b)
		if err != nil {
			return
		}
		for name := range r.Header {
			if strings.EqualFold(name, "Set-Cookie") {
				delete(r.Header, name)
			}
		}
		if len(r.Header) == 0 {
			r.Header = nil
		}
		again, err := decodeResult(encodeResult(r))
		require.NoError(t, err)
		assert.Equal(t, r, again)
	})
}
