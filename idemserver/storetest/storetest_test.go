package storetest_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/idemkit/idemhttp/idemserver"
	"github.com/idemkit/idemhttp/idemserver/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemoryStorePasses(t *testing.T) {
	storetest.RunWithClock(t, func(t *testing.T, now func() time.Time) idemserver.Store {
		return &idemserver.MemoryStore{Now: now}
	})
}

// brokenEnv names the broken store TestBrokenStore runs the suite against;
// TestSuiteCatchesBrokenStores sets it in a child process.
const brokenEnv = "STORETEST_BROKEN"

// brokenStores are stores with one bug each, built on MemoryStore.
var brokenStores = map[string]func(now func() time.Time) idemserver.Store{
	"ignores tokens": func(now func() time.Time) idemserver.Store {
		return &tokenBlind{MemoryStore: &idemserver.MemoryStore{Now: now}, tokens: map[string]string{}}
	},
	"never expires": func(now func() time.Time) idemserver.Store {
		return forever{&idemserver.MemoryStore{Now: now}}
	},
	"truncates records": func(now func() time.Time) idemserver.Store {
		return truncating{&idemserver.MemoryStore{Now: now}}
	},
	"renew does nothing": func(now func() time.Time) idemserver.Store {
		return renewless{&idemserver.MemoryStore{Now: now}}
	},
}

// renewless accepts Renew without extending the claim.
type renewless struct{ *idemserver.MemoryStore }

func (renewless) Renew(context.Context, string, string, time.Duration) error { return nil }

// tokenBlind completes and releases with whatever token last claimed the
// key: the bug a store without a token check has.
type tokenBlind struct {
	*idemserver.MemoryStore
	mu     sync.Mutex
	tokens map[string]string
}

func (s *tokenBlind) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	res, err := s.MemoryStore.Claim(ctx, key, c)
	if err == nil && res.State == idemserver.Claimed {
		s.mu.Lock()
		s.tokens[key] = c.Token
		s.mu.Unlock()
	}
	return res, err
}

func (s *tokenBlind) current(key string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[key]
}

func (s *tokenBlind) Complete(ctx context.Context, key, _ string, record []byte, ttl time.Duration) error {
	return s.MemoryStore.Complete(ctx, key, s.current(key), record, ttl)
}

func (s *tokenBlind) Release(ctx context.Context, key, _ string) error {
	return s.MemoryStore.Release(ctx, key, s.current(key))
}

// forever ignores lock timeouts and TTLs.
type forever struct{ *idemserver.MemoryStore }

func (s forever) Claim(ctx context.Context, key string, c idemserver.Claim) (idemserver.ClaimResult, error) {
	c.LockTimeout = 1000 * time.Hour
	return s.MemoryStore.Claim(ctx, key, c)
}

func (s forever) Complete(ctx context.Context, key, token string, record []byte, _ time.Duration) error {
	return s.MemoryStore.Complete(ctx, key, token, record, 1000*time.Hour)
}

// truncating loses a record's last byte, as a column too narrow would.
type truncating struct{ *idemserver.MemoryStore }

func (s truncating) Complete(ctx context.Context, key, token string, record []byte, ttl time.Duration) error {
	if len(record) > 1 {
		record = record[:len(record)-1]
	}
	return s.MemoryStore.Complete(ctx, key, token, record, ttl)
}

// TestBrokenStore runs the suite against the broken store named by the
// environment; it is a helper for TestSuiteCatchesBrokenStores and is
// skipped otherwise.
func TestBrokenStore(t *testing.T) {
	newStore, ok := brokenStores[os.Getenv(brokenEnv)]
	if !ok {
		t.Skip("helper: run by TestSuiteCatchesBrokenStores")
	}
	storetest.RunWithClock(t, func(t *testing.T, now func() time.Time) idemserver.Store {
		return newStore(now)
	})
}

// TestSuiteCatchesBrokenStores proves the suite has teeth: each broken
// store fails it, in the subtest that targets its bug.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	tests := []struct {
		give string
		want string // a subtest that must fail
	}{
		{"ignores tokens", "--- FAIL: TestBrokenStore/LockTimeoutTakeover"},
		{"never expires", "--- FAIL: TestBrokenStore/TTL"},
		{"truncates records", "--- FAIL: TestBrokenStore/RecordFidelity"},
		{"renew does nothing", "--- FAIL: TestBrokenStore/RenewExtendsLock"},
	}
	for _, tt := range tests {
		t.Run(tt.give, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestBrokenStore$", "-test.v")
			cmd.Env = append(os.Environ(), brokenEnv+"="+tt.give)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			assert.ErrorAs(t, err, &exit, "the suite must fail:\n%s", out)
			assert.Contains(t, string(out), tt.want)
		})
	}
}
