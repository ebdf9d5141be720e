//go:build !idemhttp_bug_giveupstored

package plant

// GiveUpStored, with the idemhttp_bug_giveupstored build tag: the server
// core (internal/servercore) keeps a Transactional handler that gave up
// (its client left, it wrote nothing) as an empty 200: its transaction
// commits, with what it wrote, and the key replays an empty 200 for the
// TTL, instead of rolling back and releasing the key.
const GiveUpStored = false
