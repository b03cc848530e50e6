package processmanager

// lru is a map bounded to a fixed number of entries that evicts the least
// recently used one. Nodes live in one slice linked by index, so a full cache
// adds no garbage per insert. It is not safe for concurrent use.
type lru[K comparable, V any] struct {
	index    map[K]int32
	nodes    []lruNode[K, V]
	capacity int
	// head is the most and tail the least recently used node; -1 when empty.
	head, tail int32
	// free are nodes of removed entries, reused before the slice grows.
	free []int32
}

type lruNode[K comparable, V any] struct {
	key        K
	val        V
	prev, next int32
}

func newLRU[K comparable, V any](capacity int) *lru[K, V] {
	capacity = max(capacity, 1)
	return &lru[K, V]{
		// Not presized: most hosts never fill the cache.
		index:    make(map[K]int32),
		capacity: capacity,
		head:     -1,
		tail:     -1,
	}
}

// Len is the number of entries held.
func (c *lru[K, V]) Len() int { return len(c.index) }

// Get returns the value stored under k and marks it most recently used.
func (c *lru[K, V]) Get(k K) (V, bool) {
	i, ok := c.index[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.unlink(i)
	c.pushFront(i)
	return c.nodes[i].val, true
}

// Add stores v under k, evicting the least recently used entry when full.
func (c *lru[K, V]) Add(k K, v V) {
	if i, ok := c.index[k]; ok {
		c.nodes[i].val = v
		c.unlink(i)
		c.pushFront(i)
		return
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else if len(c.nodes) < c.capacity {
		i = int32(len(c.nodes))
		c.nodes = append(c.nodes, lruNode[K, V]{})
	} else {
		i = c.tail
		c.unlink(i)
		delete(c.index, c.nodes[i].key)
	}
	c.nodes[i] = lruNode[K, V]{key: k, val: v, prev: -1, next: -1}
	c.index[k] = i
	c.pushFront(i)
}

// Remove deletes the entry stored under k, if any.
func (c *lru[K, V]) Remove(k K) {
	i, ok := c.index[k]
	if !ok {
		return
	}
	c.unlink(i)
	delete(c.index, k)
	var zero lruNode[K, V]
	c.nodes[i] = zero
	c.free = append(c.free, i)
}

func (c *lru[K, V]) unlink(i int32) {
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

func (c *lru[K, V]) pushFront(i int32) {
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

// Oldest returns the least recently used entry without marking it used.
func (c *lru[K, V]) Oldest() (K, V, bool) {
	if c.tail < 0 {
		var k K
		var v V
		return k, v, false
	}
	n := &c.nodes[c.tail]
	return n.key, n.val, true
}
