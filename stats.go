package idemhttp

// Stats is a snapshot of a [Client]'s state, for health checks and
// gauges. See [Client.Stats].
type Stats struct {
	// BudgetTokens and BudgetCapacity are the retry budget's fill and
	// size; both are 0 when the budget is disabled. A bucket near empty
	// means retries are being refused: the servers behind the client are
	// failing.
	BudgetTokens   int64
	BudgetCapacity int64

	// InFlight counts the calls to Do (and the resends of Resume) running
	// now, waits between attempts included.
	InFlight int64

	// JournalPending counts the journal's pending entries (operations
	// whose outcome is unknown), or is -1 when the journal cannot count
	// them cheaply: it has no PendingCount() int method, as
	// filejournal.Journal has (see journaltest.PendingCounter). With no
	// Journal it counts the client's in-memory operations.
	JournalPending int
}

// pendingCounter is implemented by a [Journal] that can count its pending
// entries cheaply, from memory and without I/O, for [Client.Stats], which
// health checks call often.
type pendingCounter interface {
	PendingCount() int
}

// Stats returns a snapshot of c's retry budget, calls in flight and
// pending journal entries. It is cheap and safe to call at any time, from
// any goroutine.
func (c *Client) Stats() Stats {
	c.init()
	cfg := &c.cfg
	s := Stats{InFlight: cfg.inflight.Load(), JournalPending: -1}
	if b := cfg.budget; b != nil {
		s.BudgetTokens, s.BudgetCapacity = b.tokens.Load(), b.capacity
	}
	var j Journal = cfg.mem
	if cfg.journal != nil {
		j = cfg.journal
	}
	if pc, ok := journalAs[pendingCounter](cfg.identity(j)); ok {
		s.JournalPending = pc.PendingCount()
	}
	return s
}

// PendingCount counts the pending entries, for Client.Stats.
func (m *memJournal) PendingCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, e := range m.byKey {
		if e.State == StatePending {
			n++
		}
	}
	return n
}

var _ pendingCounter = (*memJournal)(nil)
