package contract

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestKeyDigest pins the digest to SHA-256, so that an operator's
// sha256sum finds the same lines: a change of the digest is a change for
// every log reader. The vector is printf %s abc | sha256sum.
func TestKeyDigest(t *testing.T) {
	assert.Equal(t, "ba7816bf8f01", KeyDigest("abc"))
	assert.Len(t, KeyDigest(strings.Repeat("k", MaxKeyLen)), KeyDigestLen)
	assert.NotEqual(t, KeyDigest("a"), KeyDigest("b"))
}

// TestLogKey: the digest only by default; with raw, the key inlined
// beside it.
func TestLogKey(t *testing.T) {
	for _, tt := range []struct {
		give bool // raw
		want string
	}{
		{give: false, want: "msg=m key_digest=ba7816bf8f01\n"},
		{give: true, want: "msg=m key_digest=ba7816bf8f01 key=abc\n"},
	} {
		var b strings.Builder
		opts := &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
				return slog.Attr{}
			}
			return a
		}}
		slog.New(slog.NewTextHandler(&b, opts)).Info("m", LogKey("abc", tt.give))
		assert.Equal(t, tt.want, b.String())
	}
}
