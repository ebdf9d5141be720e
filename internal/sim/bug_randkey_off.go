//go:build go1.26 && !idemhttp_bug_randkey

package sim

// bugRandKey is a planted bug: with the idemhttp_bug_randkey build tag,
// the simulator gives the client no mint for its keys (internal/simkey),
// and a key the client mints comes from crypto/rand, which no seed
// reaches: a seed's trace is then one of many, as any choice the seed
// does not make would leave it. TestSim's second runs (-sim.twice) must
// see it.
const bugRandKey = false
