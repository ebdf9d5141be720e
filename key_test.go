package idemhttp

import (
	"testing"

	"github.com/google/uuid"
	"github.com/idemkit/idemhttp/internal/contract"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewKey(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		k := NewKey()
		u, err := uuid.Parse(k)
		require.NoError(t, err)
		assert.Equal(t, uuid.Version(4), u.Version())
		assert.Len(t, k, 36)
		assert.NoError(t, contract.ValidateKey(k))
		seen[k] = true
	}
	assert.Len(t, seen, 1000)
}

func TestDeriveKey(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	k1, err := DeriveKey(secret, "order-1")
	require.NoError(t, err)
	again, err := DeriveKey(secret, "order-1")
	require.NoError(t, err)
	other, err := DeriveKey(secret, "order-2")
	require.NoError(t, err)
	otherSecret, err := DeriveKey([]byte("fedcba9876543210fedcba9876543210"), "order-1")
	require.NoError(t, err)

	assert.Equal(t, k1, again, "deterministic")
	assert.NotEqual(t, k1, other)
	assert.NotEqual(t, k1, otherSecret)
	u, err := uuid.Parse(k1)
	require.NoError(t, err)
	assert.Equal(t, uuid.Version(8), u.Version())
	assert.Equal(t, uuid.RFC4122, u.Variant())
	assert.NotContains(t, k1, "0123456789abcdef")

	_, err = DeriveKey([]byte("short"), "order-1")
	assert.ErrorIs(t, err, ErrInvalidKey)
	_, err = DeriveKey(secret, "")
	assert.ErrorIs(t, err, ErrInvalidKey)
}

// The exported constants are the shared rules' values.
func TestKeyConstantsAreTheContracts(t *testing.T) {
	assert.Equal(t, contract.KeyHeader, DefaultKeyHeader)
	assert.Equal(t, contract.MaxKeyLen, MaxKeyLen)
}
