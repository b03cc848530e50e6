package processmanager

import "testing"

func TestLRU(t *testing.T) {
	c := newLRU[int, string](2)
	c.Add(1, "a")
	c.Add(2, "b")
	if _, ok := c.Get(1); !ok { // 1 is now the most recent
		t.Fatal("1 missing")
	}
	c.Add(3, "c") // evicts 2
	if _, ok := c.Get(2); ok {
		t.Error("2 should have been evicted")
	}
	for k, want := range map[int]string{1: "a", 3: "c"} {
		if got, ok := c.Get(k); !ok || got != want {
			t.Errorf("Get(%d) = %q, %v; want %q", k, got, ok, want)
		}
	}
	c.Add(3, "C") // update in place
	c.Add(4, "d") // evicts 1
	if _, ok := c.Get(1); ok {
		t.Error("1 should have been evicted")
	}
	if got, _ := c.Get(3); got != "C" {
		t.Errorf("Get(3) = %q after update", got)
	}
	if c.Len() != 2 {
		t.Errorf("Len = %d, want 2", c.Len())
	}
}

func TestLRUSizeOne(t *testing.T) {
	c := newLRU[int, int](0) // clamped to 1
	for i := range 10 {
		c.Add(i, i)
		if got, ok := c.Get(i); !ok || got != i || c.Len() != 1 {
			t.Fatalf("after Add(%d): Get = %d, %v; Len %d", i, got, ok, c.Len())
		}
	}
}

func TestLRURemove(t *testing.T) {
	c := newLRU[int, int](3)
	for i := range 3 {
		c.Add(i, i)
	}
	c.Remove(1)
	c.Remove(7) // absent
	if _, ok := c.Get(1); ok || c.Len() != 2 {
		t.Fatalf("removed entry still there (%d entries)", c.Len())
	}
	c.Add(3, 3) // takes the free node, evicts nothing
	c.Add(4, 4) // evicts 0, the least recently used
	for k, want := range map[int]bool{0: false, 2: true, 3: true, 4: true} {
		if _, ok := c.Get(k); ok != want {
			t.Errorf("key %d present %v, want %v", k, ok, want)
		}
	}
	if c.Len() != 3 || len(c.nodes) != 3 {
		t.Errorf("%d entries in %d nodes, want 3 in 3", c.Len(), len(c.nodes))
	}
}
