package tracecorr

import (
	"encoding/binary"
	"errors"
	"testing"
)

// fakeMem is process memory: bytes at base, reads elsewhere fail.
type fakeMem struct {
	base uint64
	data []byte
}

func (m fakeMem) ReadAt(p []byte, off int64) (int, error) {
	a := uint64(off)
	if a < m.base || a-m.base+uint64(len(p)) > uint64(len(m.data)) {
		return 0, errors.New("unmapped")
	}
	return copy(p, m.data[a-m.base:]), nil
}

// storageMem lays out a pointer at 0x1000 to a storage at 0x1010 whose
// strings have the given lengths (the bytes themselves are 'a's).
func storageMem(minor uint16, lengths [3]uint32, bytes int) fakeMem {
	m := fakeMem{base: 0x1000, data: make([]byte, 0x10)}
	binary.LittleEndian.PutUint64(m.data, 0x1010)
	m.data = binary.LittleEndian.AppendUint16(m.data, minor)
	for _, n := range lengths {
		m.data = binary.LittleEndian.AppendUint32(m.data, n)
		for range min(int(n), bytes) {
			m.data = append(m.data, 'a')
		}
	}
	return m
}

// TestReadProcessStorageHostile: lengths beyond the bounds, strings cut
// short, a storage not published yet or of layout 0 are errors, and none
// makes the reader allocate what a length claims.
func TestReadProcessStorageHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		mem  fakeMem
		want error
	}{
		{"well formed", storageMem(1, [3]uint32{3, 4, 5}, 1<<20), nil},
		{"not published", fakeMem{base: 0x1000, data: make([]byte, 8)}, ErrNotPublished},
		{"layout 0", storageMem(0, [3]uint32{3, 4, 5}, 1<<20), ErrBadStorage},
		{"service name of 4 GiB", storageMem(1, [3]uint32{0xffffffff, 4, 5}, 16), ErrBadStorage},
		{"socket path beyond the bound", storageMem(1, [3]uint32{3, 4, maxPathBytes + 1}, 1<<20), ErrBadStorage},
		{"cut short", storageMem(1, [3]uint32{3, 4, 100}, 10), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allocs := testing.AllocsPerRun(1, func() { ReadProcessStorage(tc.mem, 0x1000) })
			st, err := ReadProcessStorage(tc.mem, 0x1000)
			switch {
			case tc.name == "cut short":
				if err == nil {
					t.Errorf("a storage cut short read as %+v", st)
				}
			case tc.want == nil && (err != nil || st.ServiceName != "aaa" || st.SocketPath != "aaaaa"):
				t.Errorf("got %+v, %v", st, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Errorf("got %+v, %v; want %v", st, err, tc.want)
			}
			if allocs > 20 {
				t.Errorf("%.0f allocations", allocs)
			}
		})
	}
}

// FuzzProcessStorage reads process storages from arbitrary memory: errors,
// never a panic, and strings within their bounds.
func FuzzProcessStorage(f *testing.F) {
	f.Add(storageMem(1, [3]uint32{3, 4, 5}, 1<<20).data)
	f.Add(storageMem(1, [3]uint32{0xffffffff, 4, 5}, 16).data)
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ReadProcessStorage(fakeMem{base: 0x1000, data: data}, 0x1000)
		if err == nil && (len(st.ServiceName) > maxNameBytes || len(st.Environment) > maxNameBytes ||
			len(st.SocketPath) > maxPathBytes) {
			t.Fatalf("storage beyond the bounds: %d, %d, %d bytes",
				len(st.ServiceName), len(st.Environment), len(st.SocketPath))
		}
	})
}
