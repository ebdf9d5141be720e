//go:build !idemhttp_bug_nolease

package plant

// NoLeaseTake, with the idemhttp_bug_nolease build tag: a fleet journal's Begin that finds an operation's pending entry leaves its lease with the worker that held it, which may then withdraw or finish the entry its new sender sends under.
const NoLeaseTake = false
