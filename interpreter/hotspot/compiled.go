package hotspot

import (
	"encoding/binary"
	"fmt"

	"github.com/hostprof/ebpf-profiler/libpf"
)

// nmethodKey names one nmethod for good: HotSpot never gives two
// nmethods of a JVM one compile id, so an nmethod freed and another
// compiled at its address have different keys.
type nmethodKey struct {
	addr      uint64
	compileID uint32
}

// nmethodInfo is what naming an nmethod's frames takes, read once while
// it was alive.
type nmethodInfo struct {
	method                uint64 // its Method*
	tier                  string
	pcs, scopes, metadata []byte
}

// size is what the info holds, for the cache's bound.
func (n *nmethodInfo) size() int { return len(n.pcs) + len(n.scopes) + len(n.metadata) + 64 }

// compiled appends the frames of a compiled frame: the methods inlined at
// the PC, innermost first, then the nmethod's own. pcOffset is from the
// nmethod's code; top says it is the interrupted PC rather than a return
// address. The nmethod must still be the one with compileID.
func (s *symbolizer) compiled(nm uint64, compileID, pcOffset uint32, top bool, out []libpf.Frame) ([]libpf.Frame, error) {
	info, err := s.nmethod(nmethodKey{nm, compileID})
	if err != nil {
		return out, err
	}
	decode := s.pcDesc(info.pcs, pcOffset, top)
	if decode <= 0 {
		// No debug information at the PC (a native method's wrapper,
		// or code without a safepoint): the nmethod's method alone.
		m, err := s.method(info.method)
		if err != nil {
			return out, err
		}
		return append(out, m.frame(-1, info.tier, false)), nil
	}
	n := len(out)
	scopes, metadata := info.scopes, info.metadata
	for i := 0; i < maxScopes && decode > 0; i++ {
		if int(decode) >= len(scopes) {
			return out[:n], fmt.Errorf("scope at %d of %d bytes", decode, len(scopes))
		}
		st := &stream{b: scopes, pos: int(decode), bias: s.l.Unsigned5Bias}
		sender, err := st.uint()
		if err != nil {
			return out[:n], err
		}
		mi, err := st.uint()
		if err != nil {
			return out[:n], err
		}
		bci1, err := st.uint()
		if err != nil {
			return out[:n], err
		}
		if mi == 0 || uint64(mi)*8 > uint64(len(metadata)) {
			return out[:n], fmt.Errorf("scope's method %d of %d", mi, len(metadata)/8)
		}
		mp := binary.LittleEndian.Uint64(metadata[(mi-1)*8:])
		m, err := s.method(mp)
		if err != nil {
			return out[:n], err
		}
		// The stream holds bci + 1: 0 is the method's entry (-1). A scope
		// with a sender was inlined into it.
		out = append(out, m.frame(int64(bci1)-1, info.tier, sender > 0))
		if int64(sender) >= int64(decode) {
			return out[:n], fmt.Errorf("scope at %d has its sender at %d", decode, sender)
		}
		decode = int32(sender)
	}
	return out, nil
}

// nmethod returns the cached info of an nmethod, reading it while the
// nmethod at the address still has the compile id.
func (s *symbolizer) nmethod(k nmethodKey) (*nmethodInfo, error) {
	s.mu.Lock()
	info, ok := s.nmethods[k]
	s.mu.Unlock()
	if ok {
		return info, nil
	}
	// The nmethod is still allocated and the one of the frame: a freed
	// one may keep its header while its debug information (JDK 24+: in
	// the C heap) is reused.
	check := func() error {
		used, err := s.r.U8(k.addr - uint64(s.l.HeapBlockSize) + uint64(s.l.HeapBlockUsed))
		if err != nil {
			return err
		}
		if used == 0 {
			return fmt.Errorf("%w: nmethod %#x was freed", ErrStale, k.addr)
		}
		id, err := s.r.U32(k.addr + uint64(s.l.NM.CompileID))
		if err != nil {
			return err
		}
		if id&0x1fffffff != k.compileID {
			return fmt.Errorf("%w: nmethod %#x has compile id %d, the frame %d", ErrStale, k.addr, id, k.compileID)
		}
		return nil
	}
	if err := check(); err != nil {
		return nil, err
	}
	info = &nmethodInfo{}
	var err error
	if info.method, err = s.r.Ptr(k.addr + uint64(s.l.NM.Method)); err != nil {
		return nil, err
	}
	if info.pcs, info.scopes, info.metadata, err = s.debugInfo(k.addr); err != nil {
		return nil, err
	}
	info.tier = s.tier(k.addr)
	// Freed while it was read: what was read may be another's.
	if err := check(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.nmethodBytes+info.size() > maxNMethodBytes {
		clear(s.nmethods)
		s.nmethodBytes = 0
	}
	s.nmethods[k] = info
	s.nmethodBytes += info.size()
	s.mu.Unlock()
	return info, nil
}

// Compilation levels (CompLevel in compiler/compilerDefinitions.hpp): 1-3
// are C1's, 4 C2's (or a JVMCI compiler's); 0 is a native method's wrapper.
const compLevelFullOptimization = 4

// tier names the compiler of an nmethod, "" where the JVM does not say.
func (s *symbolizer) tier(nm uint64) string {
	l := &s.l.NM
	var level uint32
	switch l.CompLevelWidth {
	case 1:
		v, err := s.r.U8(nm + uint64(l.CompLevel))
		if err != nil {
			return ""
		}
		level = uint32(int8(v))
	case 4:
		v, err := s.r.U32(nm + uint64(l.CompLevel))
		if err != nil {
			return ""
		}
		level = v
	default:
		return ""
	}
	switch {
	case level == 0:
		return TierNative
	case level < compLevelFullOptimization:
		return TierC1
	case level == compLevelFullOptimization:
		return TierC2
	}
	return ""
}

// debugInfo reads an nmethod's PcDescs, scopes data and metadata.
func (s *symbolizer) debugInfo(nm uint64) (pcs, scopes, metadata []byte, err error) {
	r, l := s.r, &s.l.NM
	i32 := func(off uint32) (uint64, error) {
		v, err := r.U32(nm + uint64(off))
		return uint64(int64(int32(v))), err
	}
	var pcsLo, pcsHi, scopesLo, scopesHi, metaLo, metaHi uint64
	if l.ScopesInBlob {
		// [metadata][scopes data][PcDescs][dependencies], in the blob.
		var scopesBegin, pcsOff, depOff, metaOff uint64
		if l.ScopesDataRelative {
			if scopesBegin, err = i32(l.ScopesDataBegin); err != nil {
				return
			}
			scopesBegin += nm
		} else if scopesBegin, err = r.Ptr(nm + uint64(l.ScopesDataBegin)); err != nil {
			return
		}
		if pcsOff, err = i32(l.ScopesPCs); err != nil {
			return
		}
		if depOff, err = i32(l.Dependencies); err != nil {
			return
		}
		if metaOff, err = i32(l.Metadata); err != nil {
			return
		}
		pcsLo, pcsHi = nm+pcsOff, nm+depOff
		scopesLo, scopesHi = scopesBegin, nm+pcsOff
		metaLo, metaHi = nm+metaOff, scopesBegin
	} else {
		// [PcDescs][scopes data]… in the immutable data; the metadata
		// after the relocations in the mutable data.
		var imm, immSize, pcsOff, scopesOff, mut, relocs uint64
		if imm, err = r.Ptr(nm + uint64(l.ImmutableData)); err != nil {
			return
		}
		if pcsOff, err = i32(l.ScopesPCs); err != nil {
			return
		}
		if scopesOff, err = i32(l.ScopesData); err != nil {
			return
		}
		if immSize, err = i32(l.ImmutableDataSize); err != nil {
			return
		}
		if mut, err = r.Ptr(nm + uint64(l.MutableData)); err != nil {
			return
		}
		if relocs, err = i32(l.RelocationSize); err != nil {
			return
		}
		pcsLo, pcsHi = imm+pcsOff, imm+scopesOff
		// The scopes data ends where the next section starts, which no
		// table exports: up to the end of the immutable data.
		scopesLo, scopesHi = imm+scopesOff, imm+immSize
		metaLo = mut + relocs
		metaHi = metaLo + maxMetadata
		if l.MutableDataSize != 0 {
			size, err := i32(l.MutableDataSize)
			if err != nil {
				return nil, nil, nil, err
			}
			metaHi = mut + size
		}
	}
	read := func(lo, hi, max uint64) ([]byte, error) {
		if hi < lo || hi-lo > max {
			return nil, fmt.Errorf("nmethod %#x: section [%#x, %#x)", nm, lo, hi)
		}
		b := make([]byte, hi-lo)
		return b, r.Read(lo, b)
	}
	if pcs, err = read(pcsLo, pcsHi, maxPcDescs*uint64(l.PcDescSize)); err != nil {
		return
	}
	if scopes, err = r.ReadUpTo(scopesLo, min(scopesHi-scopesLo, maxScopesData)); err != nil {
		return
	}
	metadata, err = r.ReadUpTo(metaLo, min(metaHi-metaLo, maxMetadata))
	return
}

// Bounds of an nmethod's sections, and of the per-JVM cache of what was
// read of nmethods.
const (
	maxScopesData   = 1 << 20
	maxMetadata     = 64 << 10
	maxNMethodBytes = 16 << 20
)

// pcDesc returns the scope decode offset of the PcDesc of a PC, 0 if
// none: for a return address the PcDesc at it exactly, for the
// interrupted PC the first at or after it (nmethod::find_pc_desc).
func (s *symbolizer) pcDesc(pcs []byte, pcOffset uint32, top bool) int32 {
	size := int(s.l.NM.PcDescSize)
	if size < 8 {
		return 0
	}
	best, bestOff := int32(0), int64(-1)
	for i := 0; i+size <= len(pcs); i += size {
		off := int64(int32(binary.LittleEndian.Uint32(pcs[i:])))
		decode := int32(binary.LittleEndian.Uint32(pcs[i+4:]))
		if off == int64(pcOffset) {
			return decode
		}
		if top && off > int64(pcOffset) && (bestOff < 0 || off < bestOff) {
			best, bestOff = decode, off
		}
	}
	return best
}
