package nativeunwind

import (
	"encoding/binary"
	"strings"
)

// Bounds on what one file may make us do. CFA programs need no bound of
// their own: each lies within its entry and every instruction consumes a
// byte or more, so the work is linear in the section's size.
const (
	maxCFISectionSize = 256 << 20 // libLLVM has 5 MiB of .eh_frame
	maxFDEs           = 4 << 20
	maxCIEs           = 1 << 16
	maxRows           = 16 << 20 // CFA table rows and deltas, 24 bytes each
	maxAugmentation   = 16       // augmentation string bytes
)

// cfiSection is one .eh_frame or .debug_frame section being parsed.
type cfiSection struct {
	name    string // for errors: ".eh_frame"
	data    []byte
	isEH    bool // .eh_frame rules: CIE id 0, relative CIE pointers, augmentations
	order   binary.ByteOrder
	ptrSize int // of the target: 4 or 8
	bases   pointerBases
	arch    *archInfo

	cies map[int]*cie
}

// cie is a parsed Common Information Entry.
type cie struct {
	offset    int
	version   uint8
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    byte // pointer encoding of FDE addresses
	ptrSize   int  // address size of this CIE's FDEs (CIE version 4)
	segSize   int
	augData   bool // 'z': FDEs carry an augmentation data length
	signal    bool // 'S': FDEs describe signal trampolines
	bKey      bool // 'B': arm64 return addresses signed with the B key
	mte       bool // 'G': arm64 MTE-tagged stack frames
	insns     []byte
	insnsAt   int
	initial   frameState // the row after the initial instructions

	// unsupported is why this CIE's FDEs cannot be used ("" if they can).
	unsupported string
}

// fde is a parsed Frame Description Entry.
type fde struct {
	offset     int
	cie        *cie
	start, end uint64
	insns      []byte
	insnsAt    int
}

// entryHeader reads the length and id fields of the entry at r.pos: it
// returns the entry's end, the id (or CIE pointer) and where it was read.
// A zero length (the .eh_frame terminator) returns end == r.pos with id
// and isCIE unset.
func (s *cfiSection) entryHeader(r *reader) (end int, id uint64, idAt int, isCIE bool) {
	length := uint64(r.u32("entry length"))
	dwarf64 := false
	if length == 0xffffffff {
		length = r.u64("64-bit entry length")
		dwarf64 = true
	}
	if !r.ok() || length == 0 {
		return r.pos, 0, 0, false
	}
	if length > uint64(r.remaining()) {
		r.failf("entry length %d overruns the section (%d bytes left)", length, r.remaining())
		return r.pos, 0, 0, false
	}
	end = r.pos + int(length)
	idAt = r.pos
	switch {
	case s.isEH:
		// .eh_frame keeps a 4-byte CIE id/pointer even in 64-bit entries.
		id = uint64(r.u32("CIE id"))
		isCIE = id == 0
	case dwarf64:
		id = r.u64("CIE id")
		isCIE = id == ^uint64(0)
	default:
		id = uint64(r.u32("CIE id"))
		isCIE = id == 0xffffffff
	}
	if r.ok() && r.pos > end {
		// A length too short for the id field itself.
		r.failf("entry length %d is shorter than its CIE id", length)
		return r.pos, 0, 0, false
	}
	return end, id, idAt, isCIE
}

// forEachFDE walks the section and calls fn for every usable FDE. FDEs
// whose CIE cannot be used are counted in st and skipped.
func (s *cfiSection) forEachFDE(st *Stats, fn func(*fde) error) error {
	r := &reader{data: s.data, end: len(s.data), order: s.order}
	var f fde
	nFDEs := 0
	for !r.atEnd() {
		at := r.pos
		end, id, idAt, isCIE := s.entryHeader(r)
		if !r.ok() {
			return r.err(s.name)
		}
		if end == r.pos { // zero terminator: keep going, as readelf does
			continue
		}
		if isCIE {
			if _, err := s.cieAt(at, st); err != nil {
				return err
			}
			r.pos = end
			continue
		}
		if nFDEs++; nFDEs > maxFDEs {
			return &FormatError{Section: s.name, Offset: at, Problem: "too many FDEs"}
		}
		ciePos := int64(id)
		if s.isEH {
			ciePos = int64(idAt) - int64(id)
		}
		if ciePos < 0 || ciePos >= int64(len(s.data)) || ciePos == int64(at) {
			return &FormatError{Section: s.name, Offset: idAt, Problem: "CIE pointer out of the section"}
		}
		c, err := s.cieAt(int(ciePos), st)
		if err != nil {
			return err
		}
		r.end = end
		ok := s.parseFDE(r, c, at, &f)
		r.end = len(s.data)
		if !r.ok() {
			return r.err(s.name)
		}
		r.pos = end
		if !ok {
			st.SkippedFDEs++
			continue
		}
		if err := fn(&f); err != nil {
			return err
		}
	}
	return nil
}

// cieAt returns the CIE at a section offset, parsing it once.
func (s *cfiSection) cieAt(at int, st *Stats) (*cie, error) {
	if c, ok := s.cies[at]; ok {
		return c, nil
	}
	if len(s.cies) >= maxCIEs {
		return nil, &FormatError{Section: s.name, Offset: at, Problem: "too many CIEs"}
	}
	r := &reader{data: s.data, pos: at, end: len(s.data), order: s.order}
	end, _, _, isCIE := s.entryHeader(r)
	if !r.ok() {
		return nil, r.err(s.name)
	}
	if end == r.pos || !isCIE {
		return nil, &FormatError{Section: s.name, Offset: at, Problem: "CIE pointer does not point to a CIE"}
	}
	r.end = end
	c := s.parseCIE(r, at)
	if !r.ok() {
		return nil, r.err(s.name)
	}
	if c.unsupported == "" {
		if err := s.runCIE(c); err != nil {
			return nil, err
		}
	}
	s.cies[at] = c
	st.CIEs++
	return c, nil
}

// parseCIE reads a CIE's fields after its id; r.end is the entry's end.
func (s *cfiSection) parseCIE(r *reader, at int) *cie {
	c := &cie{offset: at, ptrSize: s.ptrSize}
	c.version = r.u8("CIE version")
	if r.ok() && c.version != 1 && c.version != 3 && c.version != 4 {
		r.failf("CIE version %d not supported", c.version)
	}
	aug := r.cstring(maxAugmentation, "CIE augmentation")
	if c.version >= 4 {
		c.ptrSize = int(r.u8("CIE address size"))
		c.segSize = int(r.u8("CIE segment selector size"))
		if r.ok() && c.ptrSize != 4 && c.ptrSize != 8 {
			r.failf("CIE address size %d not supported", c.ptrSize)
		}
	}
	if strings.HasPrefix(aug, "eh") {
		// Old GCC: a word of EH data follows the augmentation string.
		r.take(uint64(c.ptrSize), "CIE eh data")
		aug = aug[2:]
	}
	c.codeAlign = r.uleb("CIE code alignment")
	c.dataAlign = r.sleb("CIE data alignment")
	if c.version == 1 {
		c.raReg = uint64(r.u8("CIE return address register"))
	} else {
		c.raReg = r.uleb("CIE return address register")
	}
	if !s.isEH {
		c.fdeEnc = pePtr // .debug_frame addresses are plain target words
	}
	switch {
	case aug == "":
	case aug[0] == 'z':
		c.augData = true
		n := r.uleb("CIE augmentation length")
		data := r.take(n, "CIE augmentation data")
		if r.ok() {
			s.parseAugmentation(c, aug[1:], data, r.pos-len(data))
		}
	default:
		c.unsupported = "augmentation " + aug
	}
	if r.ok() && c.codeAlign == 0 {
		c.unsupported = "code alignment 0"
	}
	c.insnsAt = r.pos
	c.insns = r.data[r.pos:r.end]
	return c
}

// parseAugmentation interprets the augmentation data of a 'z' CIE at
// section offset at. What it cannot interpret makes the CIE unsupported,
// since the FDEs' meaning may depend on it.
func (s *cfiSection) parseAugmentation(c *cie, aug string, data []byte, at int) {
	r := &reader{data: s.data, pos: at, end: at + len(data), order: s.order}
	for i := 0; i < len(aug) && r.ok(); i++ {
		switch aug[i] {
		case 'L':
			r.u8("LSDA encoding")
		case 'P':
			enc := r.u8("personality encoding")
			if r.ok() {
				b := s.bases
				b.deref = nil // the personality routine is not needed
				r.pointer(enc&^peIndir, c.ptrSize, &b, "personality")
			}
		case 'R':
			c.fdeEnc = r.u8("FDE pointer encoding")
		case 'S':
			c.signal = true
		case 'B':
			c.bKey = true
		case 'G':
			c.mte = true
		default:
			c.unsupported = "augmentation z" + aug
			return
		}
	}
	if !r.ok() {
		c.unsupported = "augmentation data: " + r.problem
	}
}

// parseFDE reads an FDE's fields after its CIE pointer into f; r.end is
// the entry's end. It returns false for FDEs that describe nothing usable.
func (s *cfiSection) parseFDE(r *reader, c *cie, at int, f *fde) bool {
	if c.unsupported != "" {
		return false
	}
	if c.segSize > 0 {
		r.take(uint64(c.segSize), "FDE segment selector")
	}
	b := s.bases
	start := r.pointer(c.fdeEnc, c.ptrSize, &b, "FDE initial location")
	// The range is a plain number in the encoding's format.
	length := r.pointer(c.fdeEnc&0x0f, c.ptrSize, &b, "FDE address range")
	if c.augData {
		n := r.uleb("FDE augmentation length")
		r.take(n, "FDE augmentation data")
	}
	if !r.ok() {
		return false
	}
	end := start + length
	if end < start {
		r.failf("FDE range %#x+%#x wraps around", start, length)
		return false
	}
	*f = fde{offset: at, cie: c, start: start, end: end, insns: r.data[r.pos:r.end], insnsAt: r.pos}
	return length > 0
}
