package idemserver

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestUnreplayableMarker: the record kept for a response too large to
// store decodes to its status and errNotReplayable, never to a response;
// a damaged marker is corrupt.
func TestUnreplayableMarker(t *testing.T) {
	status, body, err := parseRecord(encodeUnreplayable(201), nil)
	assert.ErrorIs(t, err, errNotReplayable)
	assert.Equal(t, 201, status)
	assert.Nil(t, body)

	var r Response
	assert.ErrorIs(t, r.UnmarshalBinary(encodeUnreplayable(200)), errNotReplayable)

	for _, give := range [][]byte{
		{unreplayableFormat},
		{unreplayableFormat, 99},
		append(encodeUnreplayable(201), 'x'),
	} {
		_, _, err := parseRecord(give, nil)
		assert.ErrorIs(t, err, errCorrupt, "%q", give)
	}
}
