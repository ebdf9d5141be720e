package contract

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A Refresh header's URL is found as browsers find it (HTML's shared
// declarative refresh steps): after the delay and a ';' or ',', with or
// without "url" and "=", spaces allowed around them. The redaction looked
// for "url=" alone, so "url = " and a bare URL kept their secrets in a
// kept result. Checked to fail with redactRefresh looking for "url="
// only (the first three rows kept the signature).
func TestAttackRefreshURLInAnySpelling(t *testing.T) {
	for _, tt := range []struct{ give, want string }{
		{"5; url = https://h/x?X-Amz-Signature=secret", "5; url = https://h/x?X-Amz-Signature=REDACTED"},
		{"0;https://h/x?token=secret", "0;https://h/x?token=REDACTED"},
		{"1, URL =\t'https://u:secret@h/x'", "1, URL =\t'https://REDACTED@h/x'"},
		{"5; URL=https://h/done?session=secret", "5; URL=https://h/done?session=REDACTED"},
		{"3", "3"},
		{"0; url=https://h/plain", "0; url=https://h/plain"},
	} {
		got := ResultHeader(http.Header{"Refresh": {tt.give}}, nil, nil)
		assert.Equal(t, tt.want, got.Get("Refresh"), tt.give)
	}
}
