package inbox_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/idemhttp/inbox"
)

// FuzzStoredID checks StoredID's promises on any input: the stored form
// fits the column, is valid UTF-8 without NUL, is the id itself exactly
// when the id is plain, and a hashed form is never a plain id's.
func FuzzStoredID(f *testing.F) {
	f.Fuzz(func(t *testing.T, id string) {
		got := inbox.StoredID(id)
		if len(got) > inbox.MaxIDLen || !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("StoredID(%q) = %q: not storable", id, got)
		}
		plain := len(id) <= inbox.MaxIDLen && utf8.ValidString(id) && strings.IndexByte(id, 0) < 0 && !strings.HasPrefix(id, "sha256:")
		if plain != (got == id) {
			t.Fatalf("StoredID(%q) = %q: plain=%v", id, got, plain)
		}
		if !plain && inbox.StoredID(got) == got {
			t.Fatalf("hashed form %q is stored as itself, so a raw id could collide with it", got)
		}
	})
}
