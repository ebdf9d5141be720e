//go:build !idemhttp_bug_aftercommit

package plant

// AfterCommit, with the idemhttp_bug_aftercommit build tag: the modelled
// transactional database (internal/servermodel) commits a request's
// transaction, the handler's effects and the claim row with it, and then
// stores the response in a transaction of its own, apart from the
// effect's: a store that fails the second, or a server that dies between
// the two, leaves the key held by its claim row, without a record, for
// the TTL.
const AfterCommit = false
