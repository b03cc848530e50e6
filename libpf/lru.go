package libpf

import "iter"

// LRU is a map bounded by a number of entries and, optionally, by the sum of
// the costs its entries were added with (bytes held, say). When an Add puts
// it over either bound it evicts the least recently used entries until both
// hold again, but never the entry just added: one entry whose cost alone is
// over the bound is kept, as the only one.
//
// Nodes live in one slice linked by index, so a full cache adds no garbage
// per insert. It is not safe for concurrent use.
type LRU[K comparable, V any] struct {
	index      map[K]int32
	nodes      []lruNode[K, V]
	maxEntries int
	maxCost    int
	cost       int
	evictions  uint64
	// head is the most and tail the least recently used node; -1 when empty.
	head, tail int32
	// free are nodes of removed entries, reused before the slice grows.
	free []int32
}

type lruNode[K comparable, V any] struct {
	key        K
	val        V
	cost       int
	prev, next int32
}

// NewLRU returns an empty LRU holding at most maxEntries entries (at least
// one) and, if maxCost > 0, entries whose costs sum to at most maxCost.
func NewLRU[K comparable, V any](maxEntries, maxCost int) *LRU[K, V] {
	return &LRU[K, V]{
		// Not presized: most caches never fill.
		index:      make(map[K]int32),
		maxEntries: max(maxEntries, 1),
		maxCost:    maxCost,
		head:       -1,
		tail:       -1,
	}
}

// Len is the number of entries held.
func (c *LRU[K, V]) Len() int { return len(c.index) }

// Cost is the sum of the costs of the entries held.
func (c *LRU[K, V]) Cost() int { return c.cost }

// Evictions counts the entries evicted to keep the bounds; neither Remove
// nor replacing an entry counts.
func (c *LRU[K, V]) Evictions() uint64 { return c.evictions }

// Get returns the value stored under k and marks it most recently used.
func (c *LRU[K, V]) Get(k K) (V, bool) {
	i, ok := c.index[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.unlink(i)
	c.pushFront(i)
	return c.nodes[i].val, true
}

// Add stores v under k at cost, replacing what was there, marks it most
// recently used and evicts what the bounds require (see LRU).
func (c *LRU[K, V]) Add(k K, v V, cost int) {
	if i, ok := c.index[k]; ok {
		n := &c.nodes[i]
		c.cost += cost - n.cost
		n.val, n.cost = v, cost
		c.unlink(i)
		c.pushFront(i)
	} else {
		i := c.newNode()
		c.nodes[i] = lruNode[K, V]{key: k, val: v, cost: cost, prev: -1, next: -1}
		c.index[k] = i
		c.cost += cost
		c.pushFront(i)
	}
	for c.maxCost > 0 && c.cost > c.maxCost && c.tail != c.head {
		i := c.tail
		c.drop(i)
		c.free = append(c.free, i)
		c.evictions++
	}
}

// newNode returns an unlinked node for a new entry: a free one, a new one
// while the slice is below the entry bound, else that of the least
// recently used entry, evicted.
func (c *LRU[K, V]) newNode() int32 {
	if n := len(c.free); n > 0 {
		i := c.free[n-1]
		c.free = c.free[:n-1]
		return i
	}
	if len(c.nodes) < c.maxEntries {
		c.nodes = append(c.nodes, lruNode[K, V]{})
		return int32(len(c.nodes) - 1)
	}
	i := c.tail
	c.drop(i)
	c.evictions++
	return i
}

// Remove deletes the entry stored under k, if any.
func (c *LRU[K, V]) Remove(k K) {
	if i, ok := c.index[k]; ok {
		c.drop(i)
		c.free = append(c.free, i)
	}
}

// Oldest returns the least recently used entry without marking it used.
func (c *LRU[K, V]) Oldest() (K, V, bool) {
	if c.tail < 0 {
		var k K
		var v V
		return k, v, false
	}
	n := &c.nodes[c.tail]
	return n.key, n.val, true
}

// All yields the entries from the most to the least recently used, without
// marking them used. The cache must not change during the iteration.
func (c *LRU[K, V]) All() iter.Seq2[K, V] {
	return func(yield func(K, V) bool) {
		for i := c.head; i >= 0; i = c.nodes[i].next {
			if !yield(c.nodes[i].key, c.nodes[i].val) {
				return
			}
		}
	}
}

// drop unlinks node i, forgets its entry and clears it so that it holds on
// to nothing; the caller reuses or frees it.
func (c *LRU[K, V]) drop(i int32) {
	c.unlink(i)
	delete(c.index, c.nodes[i].key)
	c.cost -= c.nodes[i].cost
	c.nodes[i] = lruNode[K, V]{}
}

func (c *LRU[K, V]) unlink(i int32) {
	n := &c.nodes[i]
	if n.prev >= 0 {
		c.nodes[n.prev].next = n.next
	} else {
		c.head = n.next
	}
	if n.next >= 0 {
		c.nodes[n.next].prev = n.prev
	} else {
		c.tail = n.prev
	}
	n.prev, n.next = -1, -1
}

func (c *LRU[K, V]) pushFront(i int32) {
	n := &c.nodes[i]
	n.prev, n.next = -1, c.head
	if c.head >= 0 {
		c.nodes[c.head].prev = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}
