package filejournal

import (
	"hash/maphash"
	"iter"
)

// table indexes entries by one string of theirs: the key (byKey) or the
// operation id (byOp). It does what a map[string]*entry would, in less
// memory: a map slot holds a 16-byte string header and a pointer, about
// 38 bytes per entry at the load Go maps run at, where a slot here is one
// pointer and a 16-bit tag from its string's hash, the string being the
// entry's own: 13 to 27 bytes per entry (21 at a million), depending on
// where the shards are between doublings. The index holds millions of
// entries, twice.
//
// It is open addressing with linear probing and backward-shift deletion,
// split into shards shards that grow and shrink on their own, so that
// no insert or delete rehashes more than one shard (about 4 000 entries
// at a million). Strings are hashed with a random seed per table, so
// that keys chosen to collide cannot make one shard's probes long.
//
// The tags are what make it fast at a million entries: a probe reads
// them only (a zero tag is an empty slot), and follows a pointer (a
// cache miss, and another for the string) only when a tag matches, one
// time in 65 536 for a string that is not there. Without them, opening a
// journal of a million entries spent most of its time in probe chains.
//
// A table is not safe for concurrent use: the index's lock guards it.
type table struct {
	byOp   bool // keyed by operation id, not key
	seed   maphash.Seed
	n      int
	shards [shards]shard
}

// shard is one shard of a table: a power-of-two number of slots, or
// none. hashes[i] is the tag (see tag) of slots[i]'s string, or 0
// for an empty slot; a string's home slot is its hash's low bits.
type shard struct {
	slots  []*entry
	hashes []uint16
	n      int
}

const (
	shardBits = 8
	shards    = 1 << shardBits
	shardMin  = 8 // the fewest slots a shard that holds anything has
)

// newFjTable returns an empty table keyed by operation id if byOp, else
// by key, with room for about hint entries.
func newFjTable(byOp bool, hint int) *table {
	t := &table{byOp: byOp, seed: maphash.MakeSeed()}
	if hint > 0 {
		// Room for hint at a load of 2/3, spread evenly.
		size := shardMin
		for size*2 < (hint/shards+1)*3 {
			size *= 2
		}
		for i := range t.shards {
			t.shards[i].slots = make([]*entry, size)
			t.shards[i].hashes = make([]uint16, size)
		}
	}
	return t
}

// reserve grows every shard to hold about n/shards entries without
// growing again. It never shrinks one.
func (t *table) reserve(n int) {
	size := shardMin
	for size*3 < (n/shards+1)*4 {
		size *= 2
	}
	for i := range t.shards {
		if sh := &t.shards[i]; len(sh.slots) < size {
			t.resize(sh, size)
		}
	}
}

// name is the string le is indexed by.
func (t *table) name(le *entry) string {
	if t.byOp {
		return le.operation()
	}
	return le.key()
}

// hash and hashBytes return the hash of a string, by which it is found.
func (t *table) hash(s string) uint64      { return maphash.String(t.seed, s) }
func (t *table) hashBytes(b []byte) uint64 { return maphash.Bytes(t.seed, b) }

// shard returns the shard of hash h.
func (t *table) shard(h uint64) *shard { return &t.shards[h>>(64-shardBits)] }

// len returns how many entries the table holds.
func (t *table) len() int { return t.n }

// tag is the 16 bits of hash h a slot keeps: bits 32 to 47, which
// neither the shard (the top bits) nor the home slot (the low bits) is
// chosen by, so that a tag tells apart entries with the same home; but
// never 0, which marks an empty slot.
func tag(h uint64) uint16 {
	if v := uint16(h >> 32); v != 0 {
		return v
	}
	return 1
}

// get returns the entry indexed by s, or nil.
func (t *table) get(s string) *entry {
	sh, i := t.find(t.hash(s), s)
	if i < 0 {
		return nil
	}
	return sh.slots[i]
}

// find returns the shard of s, whose hash is h, and the slot of the
// entry indexed by s in it, or -1. A probe reads the tags only, and
// follows a slot's pointer (a cache miss, and another for its string)
// only when the tag matches.
func (t *table) find(h uint64, s string) (*shard, int) {
	sh := t.shard(h)
	if sh.n == 0 {
		return sh, -1
	}
	mask := uint64(len(sh.slots) - 1)
	tag := tag(h)
	for i := h & mask; ; i = (i + 1) & mask {
		switch sh.hashes[i] {
		case 0:
			return sh, -1
		case tag:
			if t.name(sh.slots[i]) == s {
				return sh, int(i)
			}
		}
	}
}

// put indexes le, replacing the entry indexed by the same string if any.
func (t *table) put(le *entry) {
	h := t.hash(t.name(le))
	if t.insertNew(h, le) != nil {
		sh, i := t.find(h, t.name(le))
		sh.slots[i] = le
	}
}

// insertNew indexes le, whose string's hash is h, unless the table has
// an entry indexed by the same string: then it returns that one and
// changes nothing. It is get and put in one probe, for replay, which
// must refuse a string stored twice.
func (t *table) insertNew(h uint64, le *entry) *entry {
	s := t.name(le)
	sh := t.shard(h)
	if (sh.n+1)*4 > len(sh.slots)*3 {
		t.resize(sh, max(shardMin, 2*len(sh.slots)))
	}
	mask := uint64(len(sh.slots) - 1)
	tag := tag(h)
	for i := h & mask; ; i = (i + 1) & mask {
		switch sh.hashes[i] {
		case 0:
			sh.slots[i], sh.hashes[i] = le, tag
			sh.n++
			t.n++
			return nil
		case tag:
			if cur := sh.slots[i]; t.name(cur) == s {
				return cur
			}
		}
	}
}

// del drops the entry indexed by s, if any.
func (t *table) del(s string) {
	sh, at := t.find(t.hash(s), s)
	if at < 0 {
		return
	}
	// Backward-shift deletion: move later entries of the probe run into
	// the gap when that brings them no further from their home slot, so
	// that every entry stays reachable from its home without tombstones.
	mask := uint64(len(sh.slots) - 1)
	gap := uint64(at)
	for j := (gap + 1) & mask; ; j = (j + 1) & mask {
		tag := sh.hashes[j]
		if tag == 0 {
			break
		}
		home := t.hash(t.name(sh.slots[j])) & mask
		if (j-home)&mask >= (j-gap)&mask {
			sh.slots[gap], sh.hashes[gap] = sh.slots[j], tag
			gap = j
		}
	}
	sh.slots[gap], sh.hashes[gap] = nil, 0
	sh.n--
	t.n--
	if sh.n == 0 {
		sh.slots, sh.hashes = nil, nil // give a shard emptied by a prune back
	} else if len(sh.slots) > shardMin && sh.n*8 < len(sh.slots) {
		t.resize(sh, len(sh.slots)/2)
	}
}

// resize rehashes sh's entries into size slots.
func (t *table) resize(sh *shard, size int) {
	old, oldTags := sh.slots, sh.hashes
	sh.slots, sh.hashes = make([]*entry, size), make([]uint16, size)
	mask := uint64(size - 1)
	for k, tag := range oldTags {
		if tag == 0 {
			continue
		}
		le := old[k]
		i := t.hash(t.name(le)) & mask
		for sh.hashes[i] != 0 {
			i = (i + 1) & mask
		}
		sh.slots[i], sh.hashes[i] = le, tag
	}
}

// all yields every entry, in no particular order. The table must not
// change during the iteration.
func (t *table) all() iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for i := range t.shards {
			for _, le := range t.shards[i].slots {
				if le != nil && !yield(le) {
					return
				}
			}
		}
	}
}
