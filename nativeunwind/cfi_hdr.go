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
	const name = ".eh_frame_hdr"
	r := &reader{data: data, end: len(data), order: order}
	version := r.u8("version")
	ptrEnc := r.u8("eh_frame_ptr encoding")
	countEnc := r.u8("fde_count encoding")
	tableEnc := r.u8("table encoding")
	if r.ok() && version != 1 {
		r.failf("version %d not supported", version)
	}
	b := pointerBases{section: addr, data: addr}
	var h ehFrameHdr
	h.ehFrame = r.pointer(ptrEnc, 8, &b, "eh_frame_ptr")
	if !r.ok() || countEnc == peOmit || tableEnc == peOmit {
		return h, r.err(name)
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
	return h, r.err(name)
}
