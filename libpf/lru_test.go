package libpf

import (
	"fmt"
	"slices"
	"testing"
)

// lruOp is one call on an LRU[int, string] in TestLRUBounds: Add(key,
// fmt.Sprint(key), cost) unless get or remove is set.
type lruOp struct {
	key, cost   int
	get, remove bool
}

func opAdd(key, cost int) lruOp { return lruOp{key: key, cost: cost} }
func opGet(key int) lruOp       { return lruOp{key: key, get: true} }
func opRemove(key int) lruOp    { return lruOp{key: key, remove: true} }

func TestLRUBounds(t *testing.T) {
	tests := []struct {
		name                string
		maxEntries, maxCost int
		ops                 []lruOp
		// want are the keys left, most recently used first.
		want          []int
		wantCost      int
		wantEvictions uint64
	}{
		{"entries", 2, 0,
			[]lruOp{opAdd(1, 5), opAdd(2, 5), opGet(1), opAdd(3, 5)},
			[]int{3, 1}, 10, 1},
		{"entries, no cost bound", 3, 0,
			[]lruOp{opAdd(1, 1<<40), opAdd(2, 1<<40), opAdd(3, 1)},
			[]int{3, 2, 1}, 2<<40 + 1, 0},
		{"entries clamped to one", 0, 0,
			[]lruOp{opAdd(1, 1), opAdd(2, 1), opAdd(3, 1)},
			[]int{3}, 1, 2},
		{"cost", 10, 10,
			[]lruOp{opAdd(1, 4), opAdd(2, 4), opGet(1), opAdd(3, 4)},
			[]int{3, 1}, 8, 1},
		{"cost evicts several", 10, 10,
			[]lruOp{opAdd(1, 3), opAdd(2, 3), opAdd(3, 3), opAdd(4, 8)},
			[]int{4}, 8, 3},
		{"cost exactly at the bound", 10, 10,
			[]lruOp{opAdd(1, 5), opAdd(2, 5)},
			[]int{2, 1}, 10, 0},
		{"both bounds", 3, 10,
			[]lruOp{opAdd(1, 1), opAdd(2, 1), opAdd(3, 1), opAdd(4, 1), opAdd(5, 9)},
			[]int{5, 4}, 10, 3},
		{"newest kept over the cost bound", 10, 10,
			[]lruOp{opAdd(1, 2), opAdd(2, 11)},
			[]int{2}, 11, 1},
		{"newest alone over the cost bound, then a small one", 10, 10,
			[]lruOp{opAdd(1, 11), opAdd(2, 1)},
			[]int{2}, 1, 1},
		{"replacing updates the cost", 10, 10,
			[]lruOp{opAdd(1, 4), opAdd(2, 4), opAdd(1, 1), opAdd(3, 4)},
			[]int{3, 1, 2}, 9, 0},
		{"replacing with a higher cost evicts", 10, 10,
			[]lruOp{opAdd(1, 4), opAdd(2, 4), opAdd(3, 1), opAdd(2, 8)},
			[]int{2, 3}, 9, 1},
		{"replacing is not an eviction", 2, 0,
			[]lruOp{opAdd(1, 1), opAdd(2, 1), opAdd(1, 1), opAdd(2, 1)},
			[]int{2, 1}, 2, 0},
		{"remove frees its cost and place", 2, 10,
			[]lruOp{opAdd(1, 6), opAdd(2, 4), opRemove(1), opRemove(7), opAdd(3, 6)},
			[]int{3, 2}, 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewLRU[int, string](tt.maxEntries, tt.maxCost)
			for _, op := range tt.ops {
				switch {
				case op.get:
					if v, ok := c.Get(op.key); !ok || v != fmt.Sprint(op.key) {
						t.Fatalf("Get(%d) = %q, %v", op.key, v, ok)
					}
				case op.remove:
					c.Remove(op.key)
				default:
					c.Add(op.key, fmt.Sprint(op.key), op.cost)
				}
			}
			var keys []int
			for k, v := range c.All() {
				if v != fmt.Sprint(k) {
					t.Errorf("key %d holds %q", k, v)
				}
				keys = append(keys, k)
			}
			if !slices.Equal(keys, tt.want) || c.Len() != len(tt.want) {
				t.Errorf("keys %v (Len %d), want %v", keys, c.Len(), tt.want)
			}
			if c.Cost() != tt.wantCost || c.Evictions() != tt.wantEvictions {
				t.Errorf("cost %d, %d evictions; want %d, %d", c.Cost(), c.Evictions(), tt.wantCost, tt.wantEvictions)
			}
			for k := range 10 {
				_, ok := c.Get(k)
				if ok != slices.Contains(tt.want, k) {
					t.Errorf("Get(%d) found %v", k, ok)
				}
			}
		})
	}
}

func TestLRUReplace(t *testing.T) {
	c := NewLRU[int, string](2, 0)
	c.Add(1, "a", 0)
	c.Add(2, "b", 0)
	c.Add(1, "A", 0) // replaces, and 1 is the most recent
	c.Add(3, "c", 0) // evicts 2
	if got, ok := c.Get(1); !ok || got != "A" {
		t.Errorf("Get(1) = %q, %v after the update", got, ok)
	}
	if _, ok := c.Get(2); ok {
		t.Error("2 should have been evicted")
	}
}

func TestLRURemoveReusesNode(t *testing.T) {
	c := NewLRU[int, int](3, 0)
	for i := range 3 {
		c.Add(i, i, 1)
	}
	c.Remove(1)
	c.Remove(7) // absent
	if _, ok := c.Get(1); ok || c.Len() != 2 || c.Cost() != 2 {
		t.Fatalf("removed entry still there (%d entries, cost %d)", c.Len(), c.Cost())
	}
	c.Add(3, 3, 1) // takes the free node, evicts nothing
	if c.Evictions() != 0 || len(c.free) != 0 {
		t.Errorf("%d evictions, %d free nodes after reusing the freed one", c.Evictions(), len(c.free))
	}
	c.Add(4, 4, 1) // evicts 0, the least recently used
	for k, want := range map[int]bool{0: false, 2: true, 3: true, 4: true} {
		if _, ok := c.Get(k); ok != want {
			t.Errorf("key %d present %v, want %v", k, ok, want)
		}
	}
	if c.Len() != 3 || len(c.nodes) != 3 || c.Evictions() != 1 {
		t.Errorf("%d entries in %d nodes, %d evictions; want 3 in 3, 1", c.Len(), len(c.nodes), c.Evictions())
	}
}

func TestLRUOldest(t *testing.T) {
	c := NewLRU[int, string](3, 0)
	if _, _, ok := c.Oldest(); ok {
		t.Fatal("an empty cache has an oldest entry")
	}
	c.Add(1, "a", 0)
	c.Add(2, "b", 0)
	c.Get(1)
	if k, v, ok := c.Oldest(); !ok || k != 2 || v != "b" {
		t.Errorf("Oldest = %d, %q, %v; want 2, b", k, v, ok)
	}
	c.Add(3, "c", 0) // 2 stays the oldest: Oldest did not mark it used
	if k, _, _ := c.Oldest(); k != 2 {
		t.Errorf("Oldest = %d after an Add, want 2", k)
	}
}

// TestLRUFullAllocs checks that a full cache evicting by either bound
// allocates nothing per insert.
func TestLRUFullAllocs(t *testing.T) {
	for _, maxCost := range []int{0, 100} {
		c := NewLRU[int, int](64, maxCost)
		k := 0
		allocs := testing.AllocsPerRun(10000, func() {
			c.Add(k, k, 30)
			k++
		})
		if allocs != 0 || c.Evictions() == 0 {
			t.Errorf("maxCost %d: %v allocations per Add, %d evictions", maxCost, allocs, c.Evictions())
		}
	}
}
