// Package serverclock is the seam through which the project's simulator
// gives an idemserver.Middleware a process clock of its own, without a
// field in idemserver's API for it.
//
// The Middleware reads its process's clock for the lock arithmetic of a
// claim (when a renewal is due, how long the claim is held, how long a
// Complete is tried again); the simulator sets that clock back and forward
// per seed, apart from the store's clock. idemserver registers the setter
// at its initialisation; nothing but tests and the simulator calls Set.
package serverclock

import "time"

// setter is idemserver's; nil until idemserver is initialised.
var setter func(mw any, now func() time.Time)

// Register is called once, by idemserver's initialisation, with the
// function that gives a *idemserver.Middleware the clock now.
func Register(f func(mw any, now func() time.Time)) { setter = f }

// Set gives mw, an *idemserver.Middleware, the process clock now for the
// handlers it wraps from then on; nil restores time.Now. It panics if mw
// is not an *idemserver.Middleware, or if idemserver is not linked in.
func Set(mw any, now func() time.Time) {
	if setter == nil {
		panic("serverclock: idemserver is not linked in")
	}
	setter(mw, now)
}
