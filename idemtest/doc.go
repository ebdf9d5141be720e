// Package idemtest runs a fake Stripe-style API for tests of code that
// retries HTTP requests: a loopback server, built on
// [github.com/idemkit/idemhttp/idemserver], that injects network and server
// faults deterministically and counts the side effects it executes, so a
// test can assert that no operation ran twice and none was lost.
//
//	srv := idemtest.NewServer(&idemtest.Options{
//		Faults: idemtest.Faults{Seed: 1, DropResponse: 0.3, MaxPerOperation: 2},
//	})
//	defer srv.Close()
//	// ... send POST srv.URL+"/v1/charges" with {"operation":"order-1",...}
//	// through the code under test ...
//	if n := srv.Executions("order-1"); n != 1 {
//		t.Fatalf("order-1 ran %d times", n)
//	}
//
// Variants mimic real servers: keys required or optional, in the bare or
// the quoted form, errors as IETF problems or as Stripe's error objects,
// replays marked or silent (see [Options]).
package idemtest
