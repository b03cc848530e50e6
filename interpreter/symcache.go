package interpreter

import (
	"sync"
	"sync/atomic"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// SymbolCache holds what a runtime read out of a process about an object,
// by the object's address, bounded by entries and by the bytes the
// entries hold. The runtime frees objects and reuses their addresses, so
// an entry is only as good as a check that the object there is still the
// one read: Get asks the caller's check on every hit. It is safe for
// concurrent use.
//
// The lock is never held while the caller reads the process: a slow or
// failing read of one object must not stall lookups of others. Two
// lookups that miss the same object at once both read it; the later
// entry wins.
type SymbolCache[K comparable, V comparable] struct {
	cost func(V) int

	mu  sync.Mutex
	lru *libpf.LRU[K, V]

	hits, misses, stale atomic.Uint64
}

// NewSymbolCache returns an empty cache of at most maxEntries entries
// whose costs sum to at most maxBytes (see libpf.LRU); cost is what an
// entry counts against maxBytes.
func NewSymbolCache[K comparable, V comparable](maxEntries, maxBytes int, cost func(V) int) *SymbolCache[K, V] {
	return &SymbolCache[K, V]{cost: cost, lru: libpf.NewLRU[K, V](maxEntries, maxBytes)}
}

// Get returns the entry under key if valid accepts it, else what load
// reads, which it caches. valid and load run without the lock (both may
// read the process). A failed load drops the stale entry it was to
// replace: that one would fail the check again.
func (c *SymbolCache[K, V]) Get(key K, valid func(V) bool, load func() (V, error)) (V, error) {
	c.mu.Lock()
	old, cached := c.lru.Get(key)
	c.mu.Unlock()
	if cached && valid(old) {
		c.hits.Add(1)
		return old, nil
	}
	c.misses.Add(1)
	if cached {
		c.stale.Add(1)
	}
	v, err := load()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if cached && c.holds(key, old) {
			c.lru.Remove(key)
		}
		var zero V
		return zero, err
	}
	c.lru.Add(key, v, c.cost(v))
	return v, nil
}

// holds says whether key still holds v, not an entry that a concurrent
// lookup added since. The caller holds the lock.
func (c *SymbolCache[K, V]) holds(key K, v V) bool {
	held, ok := c.lru.Get(key)
	return ok && held == v
}

// SetCost counts cost for v, which the caller grew after Get returned
// it, if key still holds v; the caller computes cost under whatever
// guards its changes to v.
func (c *SymbolCache[K, V]) SetCost(key K, v V, cost int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holds(key, v) {
		c.lru.Add(key, v, cost)
	}
}

// Stats returns the counts of the lookups so far.
func (c *SymbolCache[K, V]) Stats() CacheStats {
	c.mu.Lock()
	evictions := c.lru.Evictions()
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Stale: c.stale.Load(), Evictions: evictions}
}

// Len is the number of entries held.
func (c *SymbolCache[K, V]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Cost is the sum of the costs of the entries held.
func (c *SymbolCache[K, V]) Cost() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Cost()
}
