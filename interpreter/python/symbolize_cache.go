package python

// symEntryOverhead approximates what an entry costs beyond its strings and
// table: the entry, its map slot and the string headers.
const symEntryOverhead = 160

// symCache maps code object addresses to entries, evicting the least
// recently used when it holds more than maxEntries entries or maxBytes
// bytes. Entries are linked into a list from head (most recent) to tail.
// It is not safe for concurrent use.
type symCache struct {
	index                map[uint64]*symEntry
	head, tail           *symEntry
	maxEntries, maxBytes int
	bytes                int
	evictions            uint64
}

func newSymCache(maxEntries, maxBytes int) *symCache {
	return &symCache{index: map[uint64]*symEntry{}, maxEntries: max(maxEntries, 1), maxBytes: maxBytes}
}

func (c *symCache) get(addr uint64) (*symEntry, bool) {
	e, ok := c.index[addr]
	if ok {
		c.unlink(e)
		c.pushFront(e)
	}
	return e, ok
}

// add stores e under addr, replacing what was there. It keeps e even when
// e alone is over maxBytes, so the cache always holds the newest entry.
func (c *symCache) add(addr uint64, e *symEntry) {
	c.remove(addr)
	e.addr = addr
	e.cachedBytes = len(e.name) + len(e.file) + len(e.table) + symEntryOverhead
	c.index[addr] = e
	c.bytes += e.cachedBytes
	c.pushFront(e)
	for c.tail != e && (len(c.index) > c.maxEntries || c.bytes > c.maxBytes) {
		c.remove(c.tail.addr)
		c.evictions++
	}
}

func (c *symCache) remove(addr uint64) {
	e, ok := c.index[addr]
	if !ok {
		return
	}
	c.unlink(e)
	delete(c.index, addr)
	c.bytes -= e.cachedBytes
}

func (c *symCache) unlink(e *symEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (c *symCache) pushFront(e *symEntry) {
	e.next = c.head
	if c.head != nil {
		c.head.prev = e
	}
	c.head = e
	if c.tail == nil {
		c.tail = e
	}
}
