package contract

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// What a journal may store of a URL: never a user part (a password, or a
// Stripe-style secret key as the user name), never a credential in the
// query, never the fragment; and an unparsable URL is refused without
// quoting it. Checked to fail: with the user-part refusal removed, the
// three user-part rows store the secret; with the fragment kept, the
// fragment row does.
func TestJournalURL(t *testing.T) {
	tests := []struct {
		give    string
		want    string
		wantErr string
	}{
		{give: "https://api.example.com/v1/charges", want: "https://api.example.com/v1/charges"},
		{give: "https://api.example.com/v1/charges?limit=3#frag", want: "https://api.example.com/v1/charges?limit=3"},
		{give: "https://user:hunter2@api.example.com/x?q=1", wantErr: "user part"},
		{give: "https://sk_live_hunter2:@api.stripe.com/v1/charges", wantErr: "user part"},
		{give: "https://user@api.example.com/x", wantErr: "user part"},
		{give: "https://api.example.com/x?api_key=hunter2", wantErr: `"api_key"`},
		{give: "https://maps.example.com/x?KEY=hunter2", wantErr: `"KEY"`},
		{give: "", want: ""},
		{give: "https://user:hunter2@api.example.com/%zz", wantErr: "does not parse"},
	}
	for _, tt := range tests {
		got, err := JournalURL(tt.give, nil)
		if tt.wantErr != "" {
			if assert.ErrorIs(t, err, ErrInvalidRequest, tt.give) {
				assert.Contains(t, err.Error(), tt.wantErr, tt.give)
				assert.NotContains(t, err.Error(), "hunter2", tt.give)
			}
			continue
		}
		assert.NoError(t, err, tt.give)
		assert.Equal(t, tt.want, got, tt.give)
		assert.False(t, strings.Contains(got, "hunter2"), tt.give)
	}
}
