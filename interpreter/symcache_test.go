package interpreter

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

// testObject is what a test reads at an address: the generation of the
// object there, which changes when the address is reused.
type testObject struct {
	addr uint64
	gen  int
}

const testObjectCost = 100

// testMemory maps addresses to the generation of their object; a missing
// address is unreadable.
type testMemory map[uint64]int

var errUnreadable = errors.New("unreadable")

// lookup looks addr up as a runtime does: the generation read first is the
// object's identity.
func (m testMemory) lookup(c *SymbolCache[uint64, *testObject], addr uint64) (*testObject, bool, error) {
	gen := m[addr]
	loaded := false
	o, err := c.Get(addr, func(o *testObject) bool { return o.gen == gen }, func() (*testObject, error) {
		loaded = true
		if gen == 0 {
			return nil, errUnreadable
		}
		return &testObject{addr: addr, gen: gen}, nil
	})
	return o, loaded, err
}

func newTestCache(entries, bytes int) *SymbolCache[uint64, *testObject] {
	return NewSymbolCache[uint64](entries, bytes, func(*testObject) int { return testObjectCost })
}

func TestSymbolCache(t *testing.T) {
	// step looks addr up after setting its generation (0: unreadable).
	type step struct {
		addr       uint64
		gen        int
		wantLoaded bool
		wantErr    bool
	}
	tests := []struct {
		name           string
		entries, bytes int
		steps          []step
		want           CacheStats
		wantLen        int
	}{
		{
			name: "miss then hit", entries: 8, bytes: 1000,
			steps:   []step{{1, 1, true, false}, {1, 1, false, false}},
			want:    CacheStats{Hits: 1, Misses: 1},
			wantLen: 1,
		},
		{
			name: "reused address is stale and read again", entries: 8, bytes: 1000,
			steps:   []step{{1, 1, true, false}, {1, 2, true, false}, {1, 2, false, false}},
			want:    CacheStats{Hits: 1, Misses: 2, Stale: 1},
			wantLen: 1,
		},
		{
			name: "failed load caches nothing", entries: 8, bytes: 1000,
			steps:   []step{{1, 0, true, true}, {1, 0, true, true}},
			want:    CacheStats{Misses: 2},
			wantLen: 0,
		},
		{
			name: "failed load drops the stale entry", entries: 8, bytes: 1000,
			steps:   []step{{1, 1, true, false}, {1, 0, true, true}, {1, 0, true, true}},
			want:    CacheStats{Misses: 3, Stale: 1},
			wantLen: 0,
		},
		{
			name: "evicted by bytes", entries: 8, bytes: 2*testObjectCost + testObjectCost/2,
			steps: []step{{1, 1, true, false}, {2, 1, true, false}, {3, 1, true, false},
				{3, 1, false, false}, {2, 1, false, false}, {1, 1, true, false}},
			want:    CacheStats{Hits: 2, Misses: 4, Evictions: 2},
			wantLen: 2,
		},
		{
			name: "evicted by entries", entries: 2, bytes: 1000,
			steps:   []step{{1, 1, true, false}, {2, 1, true, false}, {1, 1, false, false}, {3, 1, true, false}, {2, 1, true, false}},
			want:    CacheStats{Hits: 1, Misses: 4, Evictions: 2},
			wantLen: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCache(tt.entries, tt.bytes)
			mem := testMemory{}
			for i, s := range tt.steps {
				mem[s.addr] = s.gen
				o, loaded, err := mem.lookup(c, s.addr)
				if loaded != s.wantLoaded || (err != nil) != s.wantErr {
					t.Fatalf("step %d: loaded %v, error %v; want loaded %v, error %v", i, loaded, err, s.wantLoaded, s.wantErr)
				}
				if err == nil && (o.addr != s.addr || o.gen != s.gen) {
					t.Fatalf("step %d: got %+v for %#x generation %d", i, *o, s.addr, s.gen)
				}
			}
			if st := c.Stats(); st != tt.want {
				t.Errorf("stats %+v, want %+v", st, tt.want)
			}
			if c.Len() != tt.wantLen || c.Cost() != tt.wantLen*testObjectCost {
				t.Errorf("%d entries of %d bytes, want %d of %d", c.Len(), c.Cost(), tt.wantLen, tt.wantLen*testObjectCost)
			}
		})
	}
}

// TestSymbolCacheSetCost grows an entry after it was cached: the cache
// makes room for it, and ignores the growth of an entry it replaced.
func TestSymbolCacheSetCost(t *testing.T) {
	c := newTestCache(8, 3*testObjectCost)
	mem := testMemory{1: 1, 2: 1}
	first, _, _ := mem.lookup(c, 1)
	mem.lookup(c, 2)
	c.SetCost(1, first, 2*testObjectCost)
	if st := c.Stats(); st.Evictions != 0 || c.Cost() != 3*testObjectCost {
		t.Fatalf("%+v, %d bytes; want 3 entries' worth, none evicted", st, c.Cost())
	}
	mem[1] = 2
	mem.lookup(c, 1)
	c.SetCost(1, first, 10*testObjectCost)
	if c.Cost() != 2*testObjectCost {
		t.Errorf("growth of a replaced entry counted: %d bytes", c.Cost())
	}
	mem.lookup(c, 2)
	c.SetCost(2, first, 10*testObjectCost)
	if c.Cost() != 2*testObjectCost {
		t.Errorf("growth counted under another key: %d bytes", c.Cost())
	}
}

// TestSymbolCacheLoadsUnlocked blocks one lookup in its load: others,
// and Stats, go on meanwhile.
func TestSymbolCacheLoadsUnlocked(t *testing.T) {
	c := newTestCache(8, 1000)
	release := make(chan struct{})
	loading := make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := c.Get(1, func(*testObject) bool { return true }, func() (*testObject, error) {
			close(loading)
			<-release
			return &testObject{addr: 1, gen: 1}, nil
		})
		done <- err
	}()
	<-loading
	if _, _, err := (testMemory{2: 1}).lookup(c, 2); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Misses != 2 {
		t.Errorf("stats %+v during a load, want 2 misses", st)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSymbolCacheConcurrent looks objects up from several goroutines while
// one reuses addresses and the cache evicts: run it with -race.
func TestSymbolCacheConcurrent(t *testing.T) {
	const addrs, goroutines, lookups = 16, 8, 500
	c := newTestCache(addrs, 4*testObjectCost)
	var gens [addrs]atomic.Int64
	for i := range gens {
		gens[i].Store(1)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range lookups {
			gens[i%addrs].Add(1)
		}
	})
	for g := range goroutines {
		wg.Go(func() {
			for i := range lookups {
				addr := uint64((g + i) % addrs)
				gen := int(gens[addr].Load())
				o, err := c.Get(addr, func(o *testObject) bool { return o.gen == gen }, func() (*testObject, error) {
					return &testObject{addr: addr, gen: gen}, nil
				})
				if err != nil || o.addr != addr || o.gen != gen {
					t.Errorf("%#x generation %d: %+v, %v", addr, gen, o, err)
					return
				}
				c.SetCost(addr, o, testObjectCost+i%3)
				_ = c.Stats()
			}
		})
	}
	wg.Wait()
	st := c.Stats()
	if st.Hits+st.Misses != goroutines*lookups || st.Evictions == 0 {
		t.Errorf("stats %+v, want %d lookups and evictions", st, goroutines*lookups)
	}
	if c.Len() > 4 {
		t.Errorf("%d entries held, over the bound", c.Len())
	}
}
