// Package suite holds the workloads of idembench: the same operations sent
// through raw net/http, go-retryablehttp, stripe-go and idemhttp to the same
// kind of loopback [idemtest.Server], measured by the same code, so that a
// row of the table differs from another only in the client.
//
// Every client is a [Sender]: it sends one operation's POST /v1/charges
// (a form body naming the operation in metadata[operation], the way
// stripe-go sends metadata) and reports the status it ended with. The
// server counts how often each operation's side effect ran; the suite
// compares that with what the client reported.
//
// The scenarios:
//   - [Overhead]: ns/op and allocs/op per POST, against a server in a child
//     process so that allocs/op counts the client only;
//   - [Chaos]: dropped requests, dropped responses after commit, replies
//     slower than the client's timeout and 503s;
//   - [Outage]: every request refused for a window: retry amplification;
//   - [Crash]: a batch process SIGKILLed mid-batch, then rerun;
//   - [JournalCost]: FileJournal syncs per request.
//
// Some scenarios re-execute the running program as a child process. A
// program or test binary that uses them must call [MaybeRunChild] first
// thing in main or TestMain.
package suite
