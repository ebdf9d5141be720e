// Package contract holds the rules that the client, the journals and the
// server half of idemhttp must keep identically: the syntax of a key and
// its two header forms, what of a request may rest in a journal (never a
// credential header, a URL's user part or a secret query value), how a
// request is fingerprinted, and how a URL is shown without its secrets.
//
// One home per rule: the root package, filejournal, idemserver, idemtest,
// the contrib journals and idemctl import it instead of keeping copies that
// drift. It knows nothing of their types: it works on strings, bytes,
// headers and URLs, so that every side can import it without a cycle.
package contract
