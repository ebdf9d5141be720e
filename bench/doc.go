// Package bench holds the side-by-side benchmarks and interoperability
// tests of idemhttp against the clients users would pick instead (raw
// net/http, go-retryablehttp, stripe-go). It is its own module so that
// those peers stay out of the library's go.mod.
package bench
