//go:build !idemhttp_bug_aftercommit

package plant

// AfterCommit, with the idemhttp_bug_aftercommit build tag: the modelled transactional database (internal/servermodel) commits a request's transaction, the handler's effects with it, and then stores the response in a transaction of its own, apart from the effect's: a server that dies between the two, or a store that fails the second, leaves the key held by its claim row, without a record, for the TTL.
const AfterCommit = false
