package contract

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A Refresh header's URL is redacted however it is spelled: after the
// delay and a ';' or ',', with or without "url" and "=", spaces allowed
// around them (HTML's shared declarative refresh steps). The redaction
// looked for "url=" alone, so "url = " and a bare URL kept their secrets
// in a kept result. Checked to fail on commit c699060 (the first three
// rows kept the signature); the rule for any URL in a header value fixes
// it, and this pins it.
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
