package contract

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// RedactKey names the key by its digest unless raw, and leaves a text
// alone for an empty key. Checked to fail without the empty-key guard
// (the digest written between every character) and with raw ignored.
func TestAttack6RedactKey(t *testing.T) {
	const s = "journal finish k-123: disk full (key k-123)"
	d := "key_digest:" + KeyDigest("k-123")
	assert.Equal(t, "journal finish "+d+": disk full (key "+d+")", RedactKey(s, "k-123", false))
	assert.Equal(t, s, RedactKey(s, "k-123", true))
	assert.Equal(t, s, RedactKey(s, "", false))
}
