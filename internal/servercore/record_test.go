package servercore

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUnreplayableMarker: the record kept for a response too large to
// store decodes to its status and ErrNotReplayable, never to a response;
// a damaged marker is corrupt.
func TestUnreplayableMarker(t *testing.T) {
	status, body, err := ParseRecord(Unreplayable(201), nil)
	assert.ErrorIs(t, err, ErrNotReplayable)
	assert.Equal(t, 201, status)
	assert.Nil(t, body)

	for _, give := range [][]byte{
		{UnreplayableFormat},
		{UnreplayableFormat, 99},
		append(Unreplayable(201), 'x'),
	} {
		_, _, err := ParseRecord(give, nil)
		assert.ErrorIs(t, err, ErrCorrupt, "%q", give)
	}
}
