package filejournal

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFjTable checks the index's hash table against a map, through
// inserts, replacements and deletes enough to grow every shard, shift
// probe runs back and shrink shards again, keyed both ways. (With the
// backward shift's condition inverted, it fails.)
func TestFjTable(t *testing.T) {
	for _, byOp := range []bool{false, true} {
		t.Run(fmt.Sprintf("byOp=%v", byOp), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			tab := newFjTable(byOp, 0)
			model := map[string]*entry{}
			name := func(i int) string { return fmt.Sprintf("n-%d", i) }
			entry := func(i int) *entry {
				if byOp {
					return newFjEntry(fmt.Sprintf("k-%d", rng.Int()), name(i), time.Time{}, time.Time{}, 0, 0, journalStatePending, 0, 0)
				}
				return newFjEntry(name(i), "", time.Time{}, time.Time{}, 0, 0, journalStatePending, 0, 0)
			}
			check := func() {
				t.Helper()
				require.Equal(t, len(model), tab.len())
				require.Equal(t, model, ijMap(tab))
				for k, le := range model {
					require.Same(t, le, tab.get(k), k)
					require.Same(t, le, tab.getBytes(tab.hashBytes([]byte(k)), []byte(k)), k)
				}
			}
			const n = 20_000
			for round := range 3 {
				for range n {
					i := rng.IntN(n)
					if rng.IntN(3) == 0 && round == 2 {
						tab.del(name(i))
						delete(model, name(i))
						continue
					}
					le := entry(i)
					tab.put(le) // a replacement when name(i) is there
					model[name(i)] = le
				}
				check()
			}
			for i := range n {
				tab.del(name(i))
				delete(model, name(i))
				if i%1000 == 0 {
					check()
				}
			}
			check()
			assert.Nil(t, tab.get("n-1"))
			for i := range tab.shards {
				assert.Nil(t, tab.shards[i].slots, "an emptied shard gives its slots back")
			}
			tab.del("absent")
			assert.Zero(t, tab.len())
		})
	}
}

func TestFjTableHint(t *testing.T) {
	tab := newFjTable(false, 100_000)
	size := len(tab.shards[0].slots)
	for i := range 100_000 {
		tab.put(newFjEntry(fmt.Sprintf("k-%d", i), "", time.Time{}, time.Time{}, 0, 0, journalStatePending, 0, 0))
	}
	assert.Equal(t, 100_000, tab.len())
	for i := range tab.shards {
		assert.Equal(t, size, len(tab.shards[i].slots), "a table sized for its entries does not grow")
	}
}

// getBytes is get for a string held as bytes, whose hash is h.
func (t *table) getBytes(h uint64, b []byte) *entry {
	sh := t.shard(h)
	if sh.n == 0 {
		return nil
	}
	mask := uint64(len(sh.slots) - 1)
	tag := tag(h)
	for i := h & mask; ; i = (i + 1) & mask {
		switch sh.hashes[i] {
		case 0:
			return nil
		case tag:
			if le := sh.slots[i]; t.name(le) == string(b) {
				return le
			}
		}
	}
}
