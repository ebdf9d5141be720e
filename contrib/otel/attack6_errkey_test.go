package otel_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idemhttp"
	idemotel "github.com/idemkit/idemhttp/contrib/otel"
)

// Without RecordKey no span carries the idempotency key, in its error
// events either: the call's error names its key ("gave up after 2
// attempts (key ...)"), and RecordError wrote that text as the exception
// event's message, so the key reached the tracing backend. The event now
// names it by its digest, and keeps its type; with RecordKey the text is
// as it was. Checked to fail with recordError calling RecordError as
// before (the key in the call span's exception.message).
func TestAttack6SpanErrorsCarryNoKey(t *testing.T) {
	const key = "caller-key-93b0e7d2c4a1"
	for _, recordKey := range []bool{false, true} {
		srv := statuses(t, 503)
		pol := fast()
		pol.MaxAttempts = 2
		r := newRig(t, pol, idemotel.Options{RecordKey: recordKey})
		_, err := r.post(t, idemhttp.WithKey(context.Background(), key), srv.URL)
		require.ErrorIs(t, err, idemhttp.ErrExhausted)
		require.Contains(t, err.Error(), key, "the call's error names its key")
		var found, exceptions bool
		for _, s := range r.spans.Ended() {
			for _, ev := range s.Events() {
				for _, kv := range ev.Attributes {
					v := kv.Value.String()
					found = found || strings.Contains(v, key)
					if kv.Key == "exception.message" {
						exceptions = true
						if !recordKey {
							assert.Contains(t, v, idemhttp.KeyDigest(key))
						}
					}
					if kv.Key == "exception.type" {
						assert.Equal(t, "*idemhttp.GiveUpError", v, "the type as RecordError names it")
					}
				}
			}
		}
		assert.True(t, exceptions, "the error was recorded")
		assert.Equal(t, recordKey, found, "the key in a span event only with RecordKey")
	}
}
