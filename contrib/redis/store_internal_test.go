package redis

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSplitValue(t *testing.T) {
	tests := []struct {
		give      string
		wantKind  byte
		wantFirst string
		wantRest  string
		wantErr   bool
	}{
		{give: claimPrefix("tok") + "fp", wantKind: 'C', wantFirst: "tok", wantRest: "fp"},
		{give: claimPrefix("") + "fp", wantKind: 'C', wantFirst: "", wantRest: "fp"},
		{give: claimPrefix("a:b") + "", wantKind: 'C', wantFirst: "a:b", wantRest: ""},
		{give: "R2:fp\x00record", wantKind: 'R', wantFirst: "fp", wantRest: "\x00record"},
		{give: "R12:fingerprint!rec", wantKind: 'R', wantFirst: "fingerprint!", wantRest: "rec"},
		{give: "", wantErr: true},
		{give: "X1:a", wantErr: true},
		{give: "C:", wantErr: true},
		{give: "C5:abc", wantErr: true},
		{give: "C-1:abc", wantErr: true},
		{give: "Cx:abc", wantErr: true},
		{give: "C99999999999999999999:a", wantErr: true},
		{give: "C07:abcdefg", wantErr: true},
		{give: "C+1:a", wantErr: true},
		{give: "C-0:", wantErr: true},
		{give: "C0:", wantKind: 'C'},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			kind, first, rest, err := splitValue(tt.give)
			if tt.wantErr {
				assert.Error(t, err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tt.wantKind, kind)
			assert.Equal(t, tt.wantFirst, first)
			assert.Equal(t, tt.wantRest, rest)
		})
	}
}

// FuzzSplitValue checks that any stored bytes parse or fail cleanly, and
// that what parses is what a claim of that token and fingerprint writes.
func FuzzSplitValue(f *testing.F) {
	f.Add(claimPrefix("tok") + "fp")
	f.Add("R2:fprecord")
	f.Add("C0:")
	f.Add("C1:")
	f.Add("R+1:ab")
	f.Fuzz(func(t *testing.T, v string) {
		kind, first, rest, err := splitValue(v)
		if err != nil {
			return
		}
		if kind != 'C' && kind != 'R' {
			t.Fatalf("kind %q", kind)
		}
		if got := string(kind) + strconv.Itoa(len(first)) + ":" + first + rest; got != v {
			t.Fatalf("%q parsed as %q, %q, %q, which writes %q", v, kind, first, rest, got)
		}
	})
}

func TestMillis(t *testing.T) {
	tests := []struct {
		give time.Duration
		want time.Duration
	}{
		{give: 0, want: time.Millisecond},
		{give: time.Nanosecond, want: time.Millisecond},
		{give: time.Millisecond, want: time.Millisecond},
		{give: time.Millisecond + 1, want: 2 * time.Millisecond},
		{give: time.Hour, want: time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.give.String(), func(t *testing.T) {
			assert.Equal(t, tt.want, millis(tt.give))
		})
	}
}
