// Package icache holds BenchmarkICache, which measures what a fetched
// line of code costs beside a keyed net/http round trip (bench/README.md,
// "Where the client's loopback gap goes"; bench/icache.sh counts its arms'
// cache misses). Its generated cold code lives here, not in the root
// package, so the root package's test build does not carry it. The
// package has no API: it is only its tests and benchmarks.
package icache
