package idemhttp

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idemhttp/internal/contract"
)

// This file finds the key header in any letter case. net/http canonicalises
// names set through Header.Set, but a map write (req.Header["idempotency-key"])
// or headers copied from configuration keep their spelling, and HTTP/2
// lower-cases every name on the wire: two spellings in one map would go out
// as two key values, and a key written in lower case would be missed and a
// second one minted beside it.

// callerKey returns the key the caller chose, from the key header (in any
// letter case) or from WithKey, or "" if none; explicit reports that it
// came from WithKey. Two different keys on one request are refused before
// anything is sent. With clone, it also copies h without the key header
// and checks the copied fields as net/http would (cloneChecked), in the
// same pass over h: a call that will send a key needs the copy, and every
// pass over a map costs a random start and an iterator.
func callerKey(ctx context.Context, h http.Header, name string, clone bool) (key string, explicit bool, hc headerCopy, err error) {
	if clone {
		hc.h = make(http.Header, len(h)+1)
	}
	for k, vv := range h {
		if len(k) != len(name) || (k != name && !strings.EqualFold(k, name)) {
			if clone {
				if hc.why == "" {
					hc.why = badField(k, vv)
				}
				hc.h[k] = vv
			}
			continue
		}
		if key, err = headerKey(key, name, vv); err != nil {
			return "", false, headerCopy{}, err
		}
	}
	if k, ok := keyFromContext(ctx); ok {
		if err := contextKey(key, k); err != nil {
			return "", false, headerCopy{}, err
		}
		return k, true, hc, nil
	}
	return key, false, hc, nil
}

// headerKey is callerKey's reading of the values vv of the key header
// name: the key they carry, key being the one found so far ("" if none),
// or why they cannot be sent.
//
//go:noinline
func headerKey(key, name string, vv []string) (string, error) {
	for _, v := range vv {
		kv, err := contract.ParseKeyHeader(v)
		if err != nil {
			return "", err
		}
		if key != "" && kv != key {
			return "", fmt.Errorf("idemhttp: %w: the request carries two %s values, %q and %q", ErrKeyConflict, name, key, kv)
		}
		key = kv
	}
	return key, nil
}

// contextKey checks the key k of WithKey against the header's key (""
// if none).
//
//go:noinline
func contextKey(key, k string) error {
	if err := contract.ValidateKey(k); err != nil {
		return err
	}
	if key != "" && key != k {
		return fmt.Errorf("idemhttp: %w: header has %q, WithKey has %q", ErrKeyConflict, key, k)
	}
	return nil
}

// headerCopy is a copy of a request's header without its key header
// (callerKey, cloneChecked), and what net/http would refuse of it: the
// first problem found, "" if none (badField). A nil h means no copy.
type headerCopy struct {
	h   http.Header
	why string
}

// cloneWithoutFold returns a copy of h without the headers named name in
// any letter case, with room for one more entry. With deep it copies the
// value slices too (for PrepareRequest, which may change them in place);
// otherwise it shares them, since nothing downstream mutates them and
// copying would cost an allocation per header on every request. A nil h
// gives an empty, non-nil Header.
func cloneWithoutFold(h http.Header, name string, deep bool) http.Header {
	out := make(http.Header, len(h)+1)
	for k, vv := range h {
		if len(k) == len(name) && (k == name || strings.EqualFold(k, name)) {
			continue
		}
		if deep && vv != nil {
			vv = append([]string(nil), vv...)
		}
		out[k] = vv
	}
	return out
}

// cloneChecked is cloneWithoutFold (shallow) that also checks every
// field it copies as unsendable would (badField), in the same pass. A
// field named name is dropped unchecked, since the caller replaces it.
func cloneChecked(h http.Header, name string) headerCopy {
	hc := headerCopy{h: make(http.Header, len(h)+1)}
	for k, vv := range h {
		if len(k) == len(name) && (k == name || strings.EqualFold(k, name)) {
			continue
		}
		if hc.why == "" {
			hc.why = badField(k, vv)
		}
		hc.h[k] = vv
	}
	return hc
}

// deleteFold removes the headers named name in any letter case.
func deleteFold(h http.Header, name string) {
	for k := range h {
		if len(k) == len(name) && strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}

// hasHeaderFold reports whether h has a non-empty header named name in any
// letter case.
func hasHeaderFold(h http.Header, name string) bool {
	for k, vv := range h {
		if len(vv) > 0 && len(k) == len(name) && strings.EqualFold(k, name) {
			return true
		}
	}
	return false
}

// keyHeaderIs reports whether h carries the key header name, in any
// letter case, exactly once and with the value want.
func keyHeaderIs(h http.Header, name, want string) bool {
	n := 0
	for k, vv := range h {
		if len(k) != len(name) || (k != name && !strings.EqualFold(k, name)) {
			continue
		}
		for _, v := range vv {
			if v != want {
				return false
			}
			n++
		}
	}
	return n == 1
}
