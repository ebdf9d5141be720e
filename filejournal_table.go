package idemhttp

import (
	"hash/maphash"
	"iter"
)

// fjTable indexes entries by one string of theirs: the key (byKey) or the
// operation id (byOp). It does what a map[string]*fjEntry would, in less
// memory: a map slot holds a 16-byte string header and a pointer, about
// 38 bytes per entry at the load Go maps run at, where a slot here is one
// pointer, the string being the entry's own, about 14 bytes per entry.
// The index holds millions of entries, twice.
//
// It is open addressing with linear probing and backward-shift deletion,
// split into fjShards shards that grow and shrink on their own, so that
// no insert or delete rehashes more than one shard (about 4 000 entries
// at a million). Strings are hashed with a random seed per table, so
// that keys chosen to collide cannot make one shard's probes long.
//
// A fjTable is not safe for concurrent use: the index's lock guards it.
type fjTable struct {
	byOp   bool // keyed by operation id, not key
	seed   maphash.Seed
	n      int
	shards [fjShards]fjShard
}

// fjShard is one shard of a fjTable: a power-of-two number of slots, or
// none.
type fjShard struct {
	slots []*fjEntry
	n     int
}

const (
	fjShardBits = 8
	fjShards    = 1 << fjShardBits
	fjShardMin  = 8 // the fewest slots a shard that holds anything has
)

// newFjTable returns an empty table keyed by operation id if byOp, else
// by key, with room for about hint entries.
func newFjTable(byOp bool, hint int) *fjTable {
	t := &fjTable{byOp: byOp, seed: maphash.MakeSeed()}
	if hint > 0 {
		// Room for hint at a load of 2/3, spread evenly.
		size := fjShardMin
		for size*2 < (hint/fjShards+1)*3 {
			size *= 2
		}
		for i := range t.shards {
			t.shards[i].slots = make([]*fjEntry, size)
		}
	}
	return t
}

// name is the string le is indexed by.
func (t *fjTable) name(le *fjEntry) string {
	if t.byOp {
		return le.operation()
	}
	return le.key()
}

func (t *fjTable) hash(s string) uint64 { return maphash.String(t.seed, s) }

// shard returns the shard of hash h.
func (t *fjTable) shard(h uint64) *fjShard { return &t.shards[h>>(64-fjShardBits)] }

// len returns how many entries the table holds.
func (t *fjTable) len() int { return t.n }

// get returns the entry indexed by s, or nil.
func (t *fjTable) get(s string) *fjEntry {
	sh, i := t.find(s)
	if i < 0 {
		return nil
	}
	return sh.slots[i]
}

// getBytes is get for a string held as bytes.
func (t *fjTable) getBytes(b []byte) *fjEntry {
	h := maphash.Bytes(t.seed, b)
	sh := t.shard(h)
	if sh.n == 0 {
		return nil
	}
	mask := uint64(len(sh.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		le := sh.slots[i]
		if le == nil || t.name(le) == string(b) {
			return le
		}
	}
}

// find returns the shard of s and the slot of the entry indexed by s in
// it, or -1.
func (t *fjTable) find(s string) (*fjShard, int) {
	h := t.hash(s)
	sh := t.shard(h)
	if sh.n == 0 {
		return sh, -1
	}
	mask := uint64(len(sh.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		le := sh.slots[i]
		if le == nil {
			return sh, -1
		}
		if t.name(le) == s {
			return sh, int(i)
		}
	}
}

// put indexes le, replacing the entry indexed by the same string if any.
func (t *fjTable) put(le *fjEntry) {
	s := t.name(le)
	h := t.hash(s)
	sh := t.shard(h)
	if (sh.n+1)*4 > len(sh.slots)*3 {
		t.resize(sh, max(fjShardMin, 2*len(sh.slots)))
	}
	mask := uint64(len(sh.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		cur := sh.slots[i]
		if cur == nil {
			sh.slots[i] = le
			sh.n++
			t.n++
			return
		}
		if t.name(cur) == s {
			sh.slots[i] = le
			return
		}
	}
}

// del drops the entry indexed by s, if any.
func (t *fjTable) del(s string) {
	sh, at := t.find(s)
	if at < 0 {
		return
	}
	// Backward-shift deletion: move later entries of the probe run into
	// the gap when that brings them no further from their home slot, so
	// that every entry stays reachable from its home without tombstones.
	mask := uint64(len(sh.slots) - 1)
	gap := uint64(at)
	for j := (gap + 1) & mask; ; j = (j + 1) & mask {
		cur := sh.slots[j]
		if cur == nil {
			break
		}
		home := t.hash(t.name(cur)) & mask
		if (j-home)&mask >= (j-gap)&mask {
			sh.slots[gap] = cur
			gap = j
		}
	}
	sh.slots[gap] = nil
	sh.n--
	t.n--
	if sh.n == 0 {
		sh.slots = nil // give a shard emptied by a prune back
	} else if len(sh.slots) > fjShardMin && sh.n*8 < len(sh.slots) {
		t.resize(sh, len(sh.slots)/2)
	}
}

// resize rehashes sh into size slots.
func (t *fjTable) resize(sh *fjShard, size int) {
	old := sh.slots
	sh.slots = make([]*fjEntry, size)
	mask := uint64(size - 1)
	for _, le := range old {
		if le == nil {
			continue
		}
		i := t.hash(t.name(le)) & mask
		for sh.slots[i] != nil {
			i = (i + 1) & mask
		}
		sh.slots[i] = le
	}
}

// all yields every entry, in no particular order. The table must not
// change during the iteration.
func (t *fjTable) all() iter.Seq[*fjEntry] {
	return func(yield func(*fjEntry) bool) {
		for i := range t.shards {
			for _, le := range t.shards[i].slots {
				if le != nil && !yield(le) {
					return
				}
			}
		}
	}
}
