package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/idemhttp/idemserver"
)

// DefaultPrefix is prepended to every key when [Options.Prefix] is empty.
const DefaultPrefix = "idemhttp:"

// Client is what [Store] needs from go-redis: [*goredis.Client],
// [*goredis.ClusterClient], [*goredis.Ring] and the Sentinel-backed
// failover clients have it. It must send writes to the primary, as all of
// them do (see the package documentation).
type Client interface {
	goredis.Scripter
	SetArgs(ctx context.Context, key string, value any, a goredis.SetArgs) *goredis.StatusCmd
}

var (
	_ Client = (*goredis.Client)(nil)
	_ Client = (*goredis.ClusterClient)(nil)
	_ Client = (*goredis.Ring)(nil)
)

// Options configures [NewStore]. A nil *Options and the zero value both
// mean the defaults.
type Options struct {
	// Prefix is prepended to every key, so that the store's keys can
	// share a database with others and be found with SCAN. Empty means
	// [DefaultPrefix].
	Prefix string

	// AllowEviction skips the check of the server's maxmemory-policy (see
	// [Store.CheckEvictionPolicy]) that the Store makes before its first
	// claim. Set it only to accept that Redis may evict records under
	// memory pressure, each of which lets its key run again, or when the
	// server refuses CONFIG GET (some managed services rename it) and its
	// policy is known by other means to be noeviction.
	AllowEviction bool
}

var _ idemserver.Store = (*Store)(nil)

// Store is an [idemserver.Store] in Redis (7.0 or later, or a compatible
// server such as Valkey), shared by every server instance that uses the
// same Redis, so that a retry that lands on another instance still finds
// the first request's claim or response.
//
// Each key holds one string: an in-progress claim, set with SET NX PX
// LockTimeout, or a completed response, set by a Lua script that checks
// the claim's token, with PX TTL. Time is Redis's own: expiry is native,
// so nothing needs pruning and the instances' clocks need not agree.
//
// A Store is safe for concurrent use. Create it with [NewStore].
type Store struct {
	c      Client
	prefix string

	checkMu sync.Mutex  // one policy check at a time
	checked atomic.Bool // the policy check passed, or AllowEviction
}

// NewStore returns a Store on c, which must reach the primary. A nil opts
// means the defaults.
//
// NewStore sends nothing; the Store checks the server's maxmemory-policy
// before its first claim, and refuses claims with an
// [*EvictionPolicyError] until the check passes (the middleware answers
// 503). Call [Store.CheckEvictionPolicy] at start to fail fast instead.
func NewStore(c Client, opts *Options) *Store {
	s := &Store{c: c, prefix: DefaultPrefix}
	if opts != nil && opts.Prefix != "" {
		s.prefix = opts.Prefix
	}
	if opts != nil && opts.AllowEviction {
		s.checked.Store(true)
	}
	return s
}

// ErrEvictionPolicy is the sentinel of [*EvictionPolicyError].
var ErrEvictionPolicy = errors.New("idemhttp/redis: maxmemory-policy may evict records")

// EvictionPolicyError reports a Redis server whose maxmemory-policy may
// evict the store's records, or whose policy could not be read. Every
// record carries a TTL (claims their lock timeout, responses their TTL), so
// every policy but noeviction may drop one under memory pressure: the
// allkeys-* policies evict any key, and the volatile-* policies evict keys
// with a TTL, which ours all are (volatile-ttl, the ones closest to
// expiry: in-progress claims first). An evicted claim or response lets its
// key run a second time. Under noeviction a full Redis refuses writes
// instead, so claims fail and the middleware answers 503: nothing runs
// twice. It matches [ErrEvictionPolicy] with [errors.Is].
type EvictionPolicyError struct {
	// Addr is the server's address, when the client says.
	Addr string
	// Policy is maxmemory-policy as the server reported it; empty when it
	// could not be read.
	Policy string
	// Err is why the policy could not be read (the server refused CONFIG
	// GET, for instance), or nil.
	Err error
}

func (e *EvictionPolicyError) Error() string {
	where := ""
	if e.Addr != "" {
		where = " on " + e.Addr
	}
	if e.Policy == "" {
		return fmt.Sprintf("idemhttp/redis: cannot read maxmemory-policy%s (%v): set it to noeviction and Options.AllowEviction, which skips the check", where, e.Err)
	}
	return fmt.Sprintf("idemhttp/redis: maxmemory-policy is %s%s: Redis may evict idempotency records, and an evicted record lets its key run again; set maxmemory-policy noeviction, or Options.AllowEviction to accept the risk", e.Policy, where)
}

// Is reports whether target is [ErrEvictionPolicy].
func (e *EvictionPolicyError) Is(target error) bool { return target == ErrEvictionPolicy }

// Unwrap returns Err.
func (e *EvictionPolicyError) Unwrap() error { return e.Err }

// configGetter is what the policy check needs of a single server's client.
type configGetter interface {
	ConfigGet(ctx context.Context, parameter string) *goredis.MapStringStringCmd
}

// CheckEvictionPolicy asks the server (every primary of a Cluster, every
// shard of a Ring) for its maxmemory-policy and returns an
// [*EvictionPolicyError] unless each says noeviction, or another error
// when a server cannot be reached. It checks even with
// Options.AllowEviction set. The check is made once: a policy changed
// later (CONFIG SET) is not seen.
func (s *Store) CheckEvictionPolicy(ctx context.Context) error {
	each := func(ctx context.Context, c *goredis.Client) error { return checkPolicy(ctx, c) }
	switch c := s.c.(type) {
	case interface {
		ForEachMaster(context.Context, func(context.Context, *goredis.Client) error) error
	}:
		return c.ForEachMaster(ctx, each)
	case interface {
		ForEachShard(context.Context, func(context.Context, *goredis.Client) error) error
	}:
		return c.ForEachShard(ctx, each)
	case configGetter:
		return checkPolicy(ctx, c)
	}
	return &EvictionPolicyError{Err: fmt.Errorf("the client (%T) cannot send CONFIG GET", s.c)}
}

// checkPolicy checks one server.
func checkPolicy(ctx context.Context, c configGetter) error {
	addr := ""
	if o, ok := c.(interface{ Options() *goredis.Options }); ok {
		addr = o.Options().Addr
	}
	m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	var reply goredis.Error
	switch {
	case errors.As(err, &reply):
		// The server answered, and refused: CONFIG may be renamed away.
		return &EvictionPolicyError{Addr: addr, Err: err}
	case err != nil:
		return fmt.Errorf("idemhttp/redis: check maxmemory-policy: %w", err)
	}
	policy, ok := m["maxmemory-policy"]
	if !ok {
		return &EvictionPolicyError{Addr: addr, Err: errors.New("no maxmemory-policy in the reply")}
	}
	if !strings.EqualFold(policy, "noeviction") {
		return &EvictionPolicyError{Addr: addr, Policy: policy}
	}
	return nil
}

// checkOnce runs CheckEvictionPolicy until it passes once.
func (s *Store) checkOnce(ctx context.Context) error {
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	if s.checked.Load() {
		return nil
	}
	if err := s.CheckEvictionPolicy(ctx); err != nil {
		return err
	}
	s.checked.Store(true)
	return nil
}

// The value under a key is one of two strings, length-prefixed so that
// tokens and fingerprints may hold any bytes:
//
//	claim:     "C" len(token) ":" token fingerprint
//	completed: "R" len(fingerprint) ":" fingerprint record
//
// The Lua scripts never parse a claim: Go sends the exact prefix
// "C" len(token) ":" token, and a claim held by that token, and by no other
// token, starts with it.

// claimPrefix returns the start of the claim value held by token.
func claimPrefix(token string) string {
	return "C" + strconv.Itoa(len(token)) + ":" + token
}

// splitValue parses a stored value into its kind ('C' or 'R'), its first
// field (token or fingerprint) and the rest (fingerprint or record). Only
// values as the store writes them parse: the length in plain decimal,
// without sign or leading zeros, as strconv.Itoa and Lua write it.
func splitValue(v string) (kind byte, first, rest string, err error) {
	bad := errors.New("not an idemhttp record")
	if len(v) < 3 || (v[0] != 'C' && v[0] != 'R') {
		return 0, "", "", bad
	}
	colon := strings.IndexByte(v, ':')
	digits := v[1:max(colon, 1)]
	if colon < 2 || len(digits) > 10 || (digits[0] == '0' && len(digits) > 1) ||
		strings.TrimLeft(digits, "0123456789") != "" {
		return 0, "", "", bad
	}
	n, _ := strconv.Atoi(digits) // at most 10 digits: cannot overflow an int64
	body := v[colon+1:]
	if n > len(body) {
		return 0, "", "", bad
	}
	return v[0], body[:n], body[n:], nil
}

// millis rounds d up to whole milliseconds, at least one: Redis counts
// expiry in milliseconds, and rounding down could expire a claim early.
func millis(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return time.Millisecond
	}
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// Claim implements [idemserver.Store.Claim] with one command, SET key
// claim NX PX lockTimeout GET, which either records the claim or returns
// the value already there. The first Claim checks the server's
// maxmemory-policy first (see [NewStore]).
//
// go-redis resends a command whose reply was lost on the network; should
// the first SET have succeeded, the second finds a claim holding the
// caller's own token, which Claim reports as Claimed: tokens are unique per
// request, so no other request can have written it.
func (s *Store) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	if c.LockTimeout <= 0 {
		return idemserver.ClaimResult{}, errors.New("idemhttp/redis: claim: lock timeout must be positive")
	}
	if !s.checked.Load() {
		if err := s.checkOnce(ctx); err != nil {
			return idemserver.ClaimResult{}, err
		}
	}
	old, err := s.c.SetArgs(ctx, s.prefix+key, claimPrefix(c.Token)+c.Fingerprint,
		goredis.SetArgs{Mode: "NX", TTL: millis(c.LockTimeout), Get: true}).Result()
	if goredis.IsOOMError(err) {
		// Under noeviction past maxmemory Redis refuses every SET, even
		// one that would only read what the key holds. Read it, so that
		// a retry of a claimed or completed key still gets 409 or its
		// replay; a free key cannot be claimed: the store is full.
		old, err = lookupScript.Run(ctx, s.c, []string{s.prefix + key}).Text()
		if errors.Is(err, goredis.Nil) {
			return idemserver.ClaimResult{}, fmt.Errorf("idemhttp/redis: claim: %w: Redis is past maxmemory", idemserver.ErrStoreFull)
		}
	}
	if errors.Is(err, goredis.Nil) {
		return idemserver.ClaimResult{State: idemserver.Claimed}, nil
	}
	if err != nil {
		return idemserver.ClaimResult{}, fmt.Errorf("idemhttp/redis: claim: %w", err)
	}
	kind, first, rest, err := splitValue(old)
	if err != nil {
		// The error goes to the middleware's log: it names no key (the
		// log line names it by its digest, see idemserver.KeyDigest).
		return idemserver.ClaimResult{}, fmt.Errorf("idemhttp/redis: claim: the key's value: %w", err)
	}
	switch {
	case kind == 'R':
		return idemserver.ClaimResult{State: idemserver.Completed, Fingerprint: first, Record: []byte(rest)}, nil
	case first == c.Token:
		return idemserver.ClaimResult{State: idemserver.Claimed}, nil
	}
	return idemserver.ClaimResult{State: idemserver.InProgress, Fingerprint: rest}, nil
}

// lookupScript reads a key, as a script so that it goes to the primary
// (a GET may be sent to a replica), which runs it even past maxmemory.
//
//	KEYS[1]  the key
var lookupScript = goredis.NewScript(`return redis.call('GET', KEYS[1])`)

// completeScript replaces the claim held by a token with the completed
// response, keeping the claim's fingerprint.
//
//	KEYS[1]  the key
//	ARGV[1]  the claim's prefix, "C" len(token) ":" token
//	ARGV[2]  the record
//	ARGV[3]  the TTL in milliseconds
//
// It returns 1, or 0 when the token holds no live claim (an expired claim
// is gone: Redis expired the key).
var completeScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
local p = ARGV[1]
if not v or string.sub(v, 1, #p) ~= p then
	return 0
end
local fp = string.sub(v, #p + 1)
redis.call('SET', KEYS[1], 'R' .. #fp .. ':' .. fp .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// releaseScript deletes the claim held by a token.
//
//	KEYS[1]  the key
//	ARGV[1]  the claim's prefix, "C" len(token) ":" token
//
// It returns 1, or 0 when the token holds no live claim.
var releaseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

// renewScript extends the claim held by a token.
//
//	KEYS[1]  the key
//	ARGV[1]  the claim's prefix, "C" len(token) ":" token
//	ARGV[2]  the lock timeout in milliseconds
//
// It returns 1, or 0 when the token holds no live claim (an expired claim
// is gone, so it cannot be revived).
var renewScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then
	return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// Renew implements [idemserver.Store.Renew] with renewScript. A resent
// Renew (see the package documentation) renews again, which is harmless.
func (s *Store) Renew(ctx context.Context, key, token string, lockTimeout time.Duration) error {
	if lockTimeout <= 0 {
		return errors.New("idemhttp/redis: renew: lock timeout must be positive")
	}
	n, err := renewScript.Run(ctx, s.c, []string{s.prefix + key}, claimPrefix(token), millis(lockTimeout).Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("idemhttp/redis: renew: %w", err)
	}
	if n == 0 {
		return idemserver.ErrClaimLost
	}
	return nil
}

// Complete implements [idemserver.Store.Complete] with completeScript. An
// empty record is refused: it would read back as a claim still in
// progress. Should go-redis resend the script after its reply was lost,
// the second run finds the response and reports ErrClaimLost, though the
// response is stored.
func (s *Store) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if len(record) == 0 {
		return errors.New("idemhttp/redis: complete: empty record")
	}
	n, err := completeScript.Run(ctx, s.c, []string{s.prefix + key},
		claimPrefix(token), record, millis(ttl).Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("idemhttp/redis: complete: %w", err)
	}
	if n == 0 {
		return idemserver.ErrClaimLost
	}
	return nil
}

// Release implements [idemserver.Store.Release] with releaseScript.
func (s *Store) Release(ctx context.Context, key, token string) error {
	n, err := releaseScript.Run(ctx, s.c, []string{s.prefix + key}, claimPrefix(token)).Int()
	if err != nil {
		return fmt.Errorf("idemhttp/redis: release: %w", err)
	}
	if n == 0 {
		return idemserver.ErrClaimLost
	}
	return nil
}
