package beam

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"
)

// BeamCodeLineTab (beam_code.h; internals.md §4, measured on 27 and 29):
// the file names (an array of terms), the size of a location (2 or 4
// bytes), the locations, then func_tab[num_functions+1]: per function a
// pointer into one ascending array of code addresses, one per line
// entry, location i belonging to the code from entry i up to entry i+1.
// A location is file << 24 | line; 2-byte locations are lines of file 0.
// Location 0 means no line.
const (
	lineFnames  = 0
	lineLocSize = 8
	lineLocTab  = 16
	lineFuncTab = 24

	locLineMask  = 1<<24 - 1
	locFileShift = 24

	maxLineItems = 1 << 24
)

// Erlang terms a file name is spelled with: a list of small integers
// (cons cells, each {head, tail}), or an atom in older releases.
const (
	listTag      = 1
	primaryMask  = 3
	smallTagMask = 0xf
	smallTag     = 0xf
	smallShift   = 4
	nilTerm      = 0x3b
	consSize     = 16
	maxFileChars = 4096
	pageSize     = 4096
)

var errNoLine = errors.New("beam: no line information")

// lineTable is what a module's line table says of all its functions,
// read once per module: where its parts are and the file names decoded
// so far.
type lineTable struct {
	addr, fnames, locSize, locTab, first uint64

	mu    sync.Mutex
	files map[uint64]string // by file index
}

// readLineTable reads the head of the line table at lt.
func (s *symbolizer) readLineTable(lt uint64) (*lineTable, error) {
	var head [lineFuncTab + 8]byte
	if err := s.r.Read(lt, head[:]); err != nil {
		return nil, err
	}
	t := &lineTable{
		addr:    lt,
		fnames:  binary.LittleEndian.Uint64(head[lineFnames:]),
		locSize: uint64(binary.LittleEndian.Uint32(head[lineLocSize:])),
		locTab:  binary.LittleEndian.Uint64(head[lineLocTab:]),
		first:   binary.LittleEndian.Uint64(head[lineFuncTab:]),
		files:   map[uint64]string{},
	}
	if t.locSize != 2 && t.locSize != 4 {
		return nil, fmt.Errorf("%w: line table at %#x with %d-byte locations", errBadObject, lt, t.locSize)
	}
	return t, nil
}

// line returns the file and line of pc in function i of the module
// whose line table is t, and the bytes the file name added to t.
func (s *symbolizer) line(t *lineTable, i, pc uint64) (string, uint32, int, error) {
	var ft [16]byte
	if err := s.r.Read(t.addr+lineFuncTab+8*i, ft[:]); err != nil {
		return "", 0, 0, err
	}
	from, to := binary.LittleEndian.Uint64(ft[:]), binary.LittleEndian.Uint64(ft[8:])
	if from < t.first || to < from || (from-t.first)%8 != 0 || (to-from)%8 != 0 || (to-t.first)/8 > maxLineItems {
		return "", 0, 0, fmt.Errorf("%w: line table at %#x: function %d's items [%#x, %#x) from %#x",
			errBadObject, t.addr, i, from, to, t.first)
	}
	if to == from {
		return "", 0, 0, errNoLine
	}
	j, _, err := s.search(from, (to-from)/8, 8, pc)
	if err != nil {
		return "", 0, 0, err
	}
	idx := (from-t.first)/8 + j
	var lb [4]byte
	if err := s.r.Read(t.locTab+idx*t.locSize, lb[:t.locSize]); err != nil {
		return "", 0, 0, err
	}
	loc := binary.LittleEndian.Uint32(lb[:])
	file := uint64(0)
	if t.locSize == 4 {
		file = uint64(loc >> locFileShift)
	}
	line := loc & locLineMask
	if line == 0 {
		return "", 0, 0, errNoLine
	}
	t.mu.Lock()
	name, known := t.files[file]
	t.mu.Unlock()
	if known {
		return name, line, 0, nil
	}
	fname, err := s.r.U64(t.fnames + 8*file)
	if err != nil {
		return "", 0, 0, err
	}
	if name, err = s.fileName(fname); err != nil {
		return "", 0, 0, err
	}
	t.mu.Lock()
	t.files[file] = name // at most 256: file is 8 bits
	t.mu.Unlock()
	return name, line, len(name) + entryOverhead, nil
}

// fileName decodes a file name term: a string (list of characters) or
// an atom.
func (s *symbolizer) fileName(term uint64) (string, error) {
	if isAtom(term) {
		return s.atomName(term)
	}
	return s.erlangString(term)
}

// erlangString decodes a proper list of Unicode code points of at most
// maxFileChars. The cells of a literal string lie together (the loader
// builds it from its end: each cell's tail is the cell before it), so it
// reads the page of a cell at once and rereads only for a cell in
// another page.
func (s *symbolizer) erlangString(term uint64) (string, error) {
	var out []byte
	var page [pageSize]byte
	pageAt := uint64(0)
	for n := 0; term != nilTerm; n++ {
		if term&primaryMask != listTag || n >= maxFileChars {
			return "", fmt.Errorf("%w: file name term %#x", errBadObject, term)
		}
		cell := term - listTag
		var head uint64
		switch {
		case cell%8 != 0:
			return "", fmt.Errorf("%w: cons cell at %#x", errBadObject, cell)
		case cell%pageSize > pageSize-consSize:
			// A cell across two pages: on its own.
			var c [consSize]byte
			if err := s.r.Read(cell, c[:]); err != nil {
				return "", err
			}
			head, term = binary.LittleEndian.Uint64(c[:]), binary.LittleEndian.Uint64(c[8:])
		default:
			if cell&^(pageSize-1) != pageAt {
				pageAt = cell &^ (pageSize - 1)
				if err := s.r.Read(pageAt, page[:]); err != nil {
					return "", err
				}
			}
			head = binary.LittleEndian.Uint64(page[cell-pageAt:])
			term = binary.LittleEndian.Uint64(page[cell-pageAt+8:])
		}
		c := head >> smallShift
		if head&smallTagMask != smallTag || c > utf8.MaxRune {
			return "", fmt.Errorf("%w: character %#x in a file name", errBadObject, head)
		}
		out = utf8.AppendRune(out, rune(c))
	}
	return string(out), nil
}
