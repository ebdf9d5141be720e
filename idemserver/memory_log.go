package idemserver

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// announce logs, once per store, what the store holds and for how long,
// at Info level through the first Middleware that wraps a handler with
// it: a memory store answers 503 once full, and a server that runs into
// that should have been told at start where the limit is and what to do
// past it (issue 34 §5). ttl is the Middleware's TTL, how long a record
// is kept.
func (s *MemoryStore) announce(logger *slog.Logger, ttl time.Duration) {
	if !s.announced.CompareAndSwap(false, true) {
		return
	}
	entries, bytes := s.maxEntries(), s.maxBytes()
	attrs := []slog.Attr{
		slog.Int64("max_entries", entries),
		slog.Int64("max_bytes", bytes),
		slog.Duration("ttl", ttl),
		slog.Int64("max_scope_entries", s.maxScopeEntries()),
		slog.Int64("max_scope_bytes", s.maxScopeBytes()),
	}
	var holds string
	switch {
	case entries < 0 && bytes < 0:
		holds = fmt.Sprintf("with no bound: its memory grows with the request rate times the TTL (%s)", ttl)
	case entries < 0:
		holds = fmt.Sprintf("up to %s of records, each kept %s: at 1 KiB a record, about %s new keys a second", byteSize(bytes), ttl, perSecond(bytes/1024, ttl))
	default:
		rate := perSecond(entries, ttl)
		attrs = append(attrs, slog.String("keys_per_second", rate))
		if bytes < 0 {
			holds = fmt.Sprintf("up to %d records, each kept %s: about %s new keys a second", entries, ttl, rate)
		} else {
			holds = fmt.Sprintf("up to %d records and %s, each kept %s: about %s new keys a second", entries, byteSize(bytes), ttl, rate)
		}
	}
	msg := "idemserver: idempotency keys are kept in this process's memory (MemoryStore), " + holds +
		"; past that, new keys get 503 until records expire, and a restart forgets them all. " +
		"For more, or for several server instances, use a shared store: contrib/postgres or contrib/redis"
	logger.LogAttrs(context.Background(), slog.LevelInfo, msg, attrs...)
}

// perSecond renders n per ttl as a rate a second: whole above ten, to
// two significant figures below.
func perSecond(n int64, ttl time.Duration) string {
	r := float64(n) / ttl.Seconds()
	switch {
	case r >= 10:
		return fmt.Sprintf("%.0f", r)
	case r >= 1:
		return fmt.Sprintf("%.1f", r)
	}
	return fmt.Sprintf("%.2g", r)
}

// byteSize renders n bytes in the largest binary unit that divides it
// to at least one.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.3g GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.3g MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.3g KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
