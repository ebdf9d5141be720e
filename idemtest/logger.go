package idemtest

import (
	"context"
	"log/slog"
)

// warnLogger is the fake's middleware logger: [slog.Default]'s handler,
// at Warn level and above. The memory store announces its capacity at
// Info when the middleware starts, advice for a real server that would
// otherwise be printed at every NewServer of every test and demo run;
// store errors (Warn, Error) still show.
var warnLogger = slog.New(minLevel{min: slog.LevelWarn})

// minLevel passes the records at min and above to h, or, with h nil, to
// slog.Default's handler of the moment, as a logger from slog.Default()
// would.
type minLevel struct {
	min slog.Level
	h   slog.Handler
}

func (m minLevel) handler() slog.Handler {
	if m.h != nil {
		return m.h
	}
	return slog.Default().Handler()
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.handler().Enabled(ctx, l)
}

func (m minLevel) Handle(ctx context.Context, r slog.Record) error {
	return m.handler().Handle(ctx, r)
}

func (m minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{min: m.min, h: m.handler().WithAttrs(attrs)}
}

func (m minLevel) WithGroup(name string) slog.Handler {
	return minLevel{min: m.min, h: m.handler().WithGroup(name)}
}
