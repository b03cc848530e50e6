package nativeunwind

import "encoding/binary"

// hdrEntry is one entry of the .eh_frame_hdr binary search table: the
// initial location of an FDE and the FDE's address.
type hdrEntry struct {
	start, fde uint64
}

// ehFrameHdr is a parsed .eh_frame_hdr (LSB "The .eh_frame_hdr section").
// Extraction walks .eh_frame itself; the table serves to cross-check it.
type ehFrameHdr struct {
	ehFrame uint64 // address of .eh_frame
	table   []hdrEntry
}

// parseEhFrameHdr parses the .eh_frame_hdr section at address addr.
func parseEhFrameHdr(data []byte, addr uint64, order binary.ByteOrder) (ehFrameHdr, error) {
	r := &reader{data: data, end: len(data), order: order}
	b := ehFrameHdrBases(addr)
	var h ehFrameHdr
	var countEnc, tableEnc byte
	h.ehFrame, countEnc, tableEnc = readEhFrameHdrHead(r, &b)
	if !r.ok() || countEnc == peOmit || tableEnc == peOmit {
		return h, r.err(ehFrameHdrName)
	}
	n := r.pointer(countEnc, 8, &b, "fde_count")
	// Each entry takes at least two bytes: reject counts the section
	// cannot hold before allocating.
	if r.ok() && n > uint64(r.remaining()/2) {
		r.failf("fde_count %d too large for %d bytes", n, r.remaining())
	}
	for i := uint64(0); i < n && r.ok(); i++ {
		start := r.pointer(tableEnc, 8, &b, "table initial location")
		fde := r.pointer(tableEnc, 8, &b, "table FDE address")
		h.table = append(h.table, hdrEntry{start, fde})
	}
	return h, r.err(ehFrameHdrName)
}

const ehFrameHdrName = ".eh_frame_hdr"

// ehFrameHdrHeadSize bounds the fields before the table: four bytes and
// two pointers, each of at most 10 bytes (a LEB128) or 7 of alignment
// and 8.
const ehFrameHdrHeadSize = 4 + 2*15

// ehFramePtr returns the address of .eh_frame that the .eh_frame_hdr at
// address addr points to; data needs to hold only the header's first
// ehFrameHdrHeadSize bytes.
func ehFramePtr(data []byte, addr uint64, order binary.ByteOrder) (uint64, error) {
	r := &reader{data: data, end: len(data), order: order}
	b := ehFrameHdrBases(addr)
	eh, _, _ := readEhFrameHdrHead(r, &b)
	return eh, r.err(ehFrameHdrName)
}

// ehFrameHdrBases are the pointer bases of the header at address addr:
// pcrel pointers are relative to their field, datarel ones to the header.
func ehFrameHdrBases(addr uint64) pointerBases {
	return pointerBases{section: addr, data: addr}
}

// readEhFrameHdrHead reads the header's fields up to fde_count: the
// address of .eh_frame and the encodings of the count and the table.
func readEhFrameHdrHead(r *reader, b *pointerBases) (ehFrame uint64, countEnc, tableEnc byte) {
	version := r.u8("version")
	ptrEnc := r.u8("eh_frame_ptr encoding")
	countEnc = r.u8("fde_count encoding")
	tableEnc = r.u8("table encoding")
	if r.ok() && version != 1 {
		r.failf("version %d not supported", version)
	}
	ehFrame = r.pointer(ptrEnc, 8, b, "eh_frame_ptr")
	return ehFrame, countEnc, tableEnc
}
