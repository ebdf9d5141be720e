package idemtest

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestServerKeepsInfoQuiet: a fake server does not pass on its memory
// store's capacity notice (Info, advice for real servers) to the default
// logger, at every NewServer of every test and demo; warnings and errors
// still reach it. Checked to fail with the middleware's Logger unset.
func TestServerKeepsInfoQuiet(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	NewServer(nil).Close()
	assert.Empty(t, buf.String())

	warnLogger.With("k", "v").Warn("store failed")
	warnLogger.Info("not shown")
	assert.Contains(t, buf.String(), `level=WARN msg="store failed" k=v`)
	assert.NotContains(t, buf.String(), "not shown")
}
