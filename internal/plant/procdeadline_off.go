//go:build !idemhttp_bug_procdeadline

package plant

// ProcDeadline, with the idemhttp_bug_procdeadline build tag:
// idemserver.Middleware bounds each store call by a reading of its
// process's clock as such (context.WithDeadline), which the runtime
// measures on a clock of its own, instead of by the time left on the
// process's clock: once that clock is set back, every call's deadline has
// passed before it begins, and once set forward, a call hangs past the
// claim's lock.
const ProcDeadline = false
