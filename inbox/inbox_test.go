package inbox_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp"
	"github.com/idemkit/idemhttp/inbox"
	"github.com/idemkit/idemhttp/internal/contract"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStoredID(t *testing.T) {
	long := strings.Repeat("x", inbox.MaxIDLen)
	tests := []struct {
		give   string
		hashed bool
	}{
		{give: "order-1"},
		{give: long},
		{give: "ünïcödé"},
		{give: long + "y", hashed: true},
		{give: "\xff\xfe", hashed: true},
		{give: "nul\x00inside", hashed: true},
		{give: "sha256:0000", hashed: true},
	}
	for _, tt := range tests {
		got := inbox.StoredID(tt.give)
		if tt.hashed {
			assert.Regexp(t, `^sha256:[0-9a-f]{64}$`, got, tt.give)
			assert.Equal(t, got, inbox.StoredID(tt.give), "stable")
		} else {
			assert.Equal(t, tt.give, got)
		}
	}
	assert.NotEqual(t, inbox.StoredID(long+"a"), inbox.StoredID(long+"b"), "no merging by truncation")
	// A raw id spelled like a hash is hashed again, so it cannot collide
	// with the id whose hash it spells.
	h := inbox.StoredID(long + "a")
	assert.NotEqual(t, h, inbox.StoredID(h))
}

func TestDeriveKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	k1, err := inbox.DeriveKey(secret, "billing", "m-1")
	require.NoError(t, err)
	require.NoError(t, contract.ValidateKey(k1))
	again, err := inbox.DeriveKey(secret, "billing", "m-1")
	require.NoError(t, err)
	assert.Equal(t, k1, again, "every delivery derives the same key")

	for _, other := range [][2]string{{"billing", "m-2"}, {"mailer", "m-1"}, {"billing:m", "-1"}, {"b", "illing:m-1"}} {
		k, err := inbox.DeriveKey(secret, other[0], other[1])
		require.NoError(t, err)
		assert.NotEqual(t, k1, k, other)
	}

	_, err = inbox.DeriveKey(secret, "billing", "")
	assert.ErrorIs(t, err, inbox.ErrNoMessageID)
	_, err = inbox.DeriveKey(secret, "", "m-1")
	assert.ErrorIs(t, err, inbox.ErrInvalidConsumer)
	_, err = inbox.DeriveKey([]byte("short"), "billing", "m-1")
	assert.ErrorIs(t, err, idemhttp.ErrInvalidKey)
}

func TestSchemaRefusesBadTableNames(t *testing.T) {
	for _, name := range []string{"1abc", "a-b", "a.b", "a b", strings.Repeat("a", 64)} {
		_, err := (&inbox.SQL{Table: name}).Schema()
		assert.ErrorIs(t, err, inbox.ErrInvalidTable, name)
	}
	s, err := (&inbox.SQL{}).Schema()
	require.NoError(t, err)
	assert.Contains(t, s, "CREATE TABLE IF NOT EXISTS idemhttp_inbox")
}
