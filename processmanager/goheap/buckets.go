// Package goheap reads a Go program's heap profile from outside it: the
// runtime's memory-profile buckets (the data behind /debug/pprof/heap),
// read from the process's memory without stopping it.
//
// Facts about the runtime's layout come from its sources (src/runtime/
// mprof.go of go1.19.8, go1.21.13 to go1.26.8 and go1.27.3; go1.18 from
// golang/go issue 45894) and from disassembling small programs built by
// each release; they are stated in our own words below.
//
// A bucket, on 64-bit targets in every release from 1.18: next (the hash
// chain, 8 bytes), allnext (the list runtime.mbuckets heads, 8), typ (1
// for memory, 8), hash (8), size (the allocation's size class, 8), nstk
// (8), then nstk return addresses, innermost first, then the memory
// record: the published cycle ("active") and three cycles being
// collected ("future"), each the counts of allocations and frees, and,
// before 1.27, their bytes (from 1.27 bytes are counts times size).
package goheap

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter/procmem"
)

// Layout is what differs between releases.
type Layout struct {
	// CycleBytes is one memRecordCycle's size: 32 (allocs, frees,
	// alloc_bytes, free_bytes) before Go 1.27, 16 (allocs, frees) from it.
	CycleBytes int
}

// LayoutFor returns the layout of Go 1.minor (18 and later).
func LayoutFor(minor int) (Layout, error) {
	switch {
	case minor < 18:
		return Layout{}, fmt.Errorf("Go 1.%d: memory profiles are read from Go 1.18 on", minor)
	case minor < 27:
		return Layout{CycleBytes: 32}, nil
	default:
		return Layout{CycleBytes: 16}, nil
	}
}

// Bounds of one read, far above what programs have: a bucket's stack is at
// most 1024 (+2) frames (profstackdepth's cap), and large services reach
// about 100,000 buckets after hours (some 40 MiB of buckets 32 frames
// deep).
const (
	maxStack     = 1026
	maxBuckets   = 1 << 20
	maxReadBytes = 128 << 20
	headerSize   = 6 * 8
)

// Bucket is one allocation site: its stack and counts, as the runtime's
// own heap profile reports them (before scaling by the sampling rate).
type Bucket struct {
	// Stack are return addresses, innermost first (symbolize at pc-1).
	Stack []uint64
	// Size is the allocations' size.
	Size uint64
	// Allocs and Frees count sampled allocations and frees;
	// AllocBytes and FreeBytes their bytes.
	Allocs, Frees, AllocBytes, FreeBytes uint64
}

// InUse are the bucket's live objects and bytes.
func (b *Bucket) InUse() (objects, bytes uint64) {
	return b.Allocs - b.Frees, b.AllocBytes - b.FreeBytes
}

// ErrDamaged says a bucket did not read as the runtime writes one (a
// torn read, or memory that is not a bucket list).
var ErrDamaged = errors.New("damaged memory-profile bucket")

// cycle is one memRecordCycle.
type cycle struct{ allocs, frees, allocBytes, freeBytes uint64 }

func (c *cycle) add(o cycle) {
	c.allocs += o.allocs
	c.frees += o.frees
	c.allocBytes += o.allocBytes
	c.freeBytes += o.freeBytes
}

// readAttempts is how often a bucket whose counts read torn (the runtime
// updated them meanwhile) is read again before it is skipped.
const readAttempts = 3

// Read walks the bucket list whose head is the pointer at headAddr
// (runtime.mbuckets) and returns the memory buckets as
// runtime.MemProfile would: the published cycle, plus the current one if
// it was not flushed yet (flushed is mProfCycle's low bit; 1.18's
// mProf.flushed), or, before the first garbage collection (every
// published count zero), everything collected so far. Buckets whose
// counts kept reading torn are skipped, counted in skipped.
func Read(mem *procmem.Reader, l Layout, headAddr uint64, cycleNum uint32, flushed bool) (buckets []Bucket, skipped int, err error) {
	head, err := mem.U64(headAddr)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the bucket list's head: %w", err)
	}
	type raw struct {
		b       Bucket
		active  cycle
		futures [3]cycle
		torn    bool
	}
	var raws []raw
	seen := map[uint64]bool{}
	anyActive := false
	var hdr [headerSize]byte
	le := binary.LittleEndian
	total := uint64(0)
	for addr := head; addr != 0; {
		if len(raws) >= maxBuckets || seen[addr] || total > maxReadBytes {
			return nil, 0, fmt.Errorf("%w: the list at %#x cycles or exceeds %d buckets or %d MiB",
				ErrDamaged, headAddr, maxBuckets, maxReadBytes>>20)
		}
		seen[addr] = true
		// A bucket's header and stack never change once it is in the
		// list (it is published complete); its counts do.
		if err := mem.Read(addr, hdr[:]); err != nil {
			return nil, 0, err
		}
		next, typ, size, nstk := le.Uint64(hdr[8:]), le.Uint64(hdr[16:]), le.Uint64(hdr[32:]), le.Uint64(hdr[40:])
		if typ != 1 || nstk == 0 || nstk > maxStack {
			return nil, 0, fmt.Errorf("%w at %#x: type %d, %d frames", ErrDamaged, addr, typ, nstk)
		}
		body := make([]byte, 8*nstk+uint64(4*l.CycleBytes))
		total += headerSize + uint64(len(body))
		r := raw{b: Bucket{Size: size, Stack: make([]uint64, nstk)}}
		for attempt := 0; attempt < readAttempts; attempt++ {
			if err := mem.Read(addr+headerSize, body); err != nil {
				return nil, 0, err
			}
			rec := body[8*nstk:]
			r.torn = false
			for i := range 4 {
				c := rec[i*l.CycleBytes:]
				cy := cycle{allocs: le.Uint64(c), frees: le.Uint64(c[8:])}
				if l.CycleBytes == 32 {
					cy.allocBytes, cy.freeBytes = le.Uint64(c[16:]), le.Uint64(c[24:])
					// Every event adds the bucket's size to the bytes.
					r.torn = r.torn || cy.allocBytes != cy.allocs*size || cy.freeBytes != cy.frees*size
				} else {
					cy.allocBytes, cy.freeBytes = cy.allocs*size, cy.frees*size
				}
				if i == 0 {
					r.active = cy
				} else {
					r.futures[i-1] = cy
				}
			}
			r.torn = r.torn || r.active.frees > r.active.allocs
			if !r.torn {
				break
			}
		}
		for i := range r.b.Stack {
			r.b.Stack[i] = le.Uint64(body[8*i:])
		}
		anyActive = anyActive || (!r.torn && (r.active.allocs != 0 || r.active.frees != 0))
		raws = append(raws, r)
		addr = next
	}
	buckets = make([]Bucket, 0, len(raws))
	for _, r := range raws {
		c := r.active
		switch {
		case r.torn:
			skipped++
			continue
		case !anyActive:
			for _, f := range r.futures {
				c.add(f)
			}
		case !flushed:
			c.add(r.futures[cycleNum%3])
		}
		if c.frees > c.allocs {
			skipped++
			continue
		}
		b := r.b
		b.Allocs, b.Frees, b.AllocBytes, b.FreeBytes = c.allocs, c.frees, c.allocBytes, c.freeBytes
		buckets = append(buckets, b)
	}
	return buckets, skipped, nil
}
