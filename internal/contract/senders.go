package contract

// Senders is what one of the project's own journals declares of who may
// send under its keys, through a method
//
//	JournalSenders() contract.Senders
//
// which idemhttp.Client looks for on the journal it is given and on every
// journal reached from it by Unwrap. The type is internal on purpose: a
// journal outside the project cannot declare it, so a user's journal, and
// a wrapper that hides the journal it wraps, count as shared by senders
// the client cannot see (fail closed: the client then reads no 409 of a
// minted key as the application's, and withdraws no entry).
//
// A wrapper that embeds one of these journals' concrete types promotes
// the method, and the declaration stays true: Store is the embedded
// journal, not the wrapper, so every Client that reaches the journal,
// through whatever wrappers, shares its senders' slots.
type Senders struct {
	// Store is the journal that holds the entries (the receiver of the
	// method): a comparable value, the scope of the senders' slots of every
	// Client of the process that reaches it.
	Store any
	// OneProcess declares that no other process sends under the journal's
	// keys: filejournal's file is locked against a second opener, and the
	// client's in-memory journal is one Client's. A journal a fleet shares
	// (contrib/postgres's) declares false: its writes are fenced across
	// processes by leases, and a key minted for a call may be sent by
	// another worker the moment Begin returns.
	OneProcess bool
}
