package libc

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"testing"
)

// FuzzTSDLayout decodes arbitrary code as an x86_64 or arm64
// pthread_getspecific: the decoders must return a layout of glibc's or
// musl's shape or an ErrTSDCode, never panic or loop.
func FuzzTSDLayout(f *testing.F) {
	for _, tc := range tsdCases {
		code, err := hex.DecodeString(tc.code)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(tc.arch == elf.EM_AARCH64, code)
	}
	f.Fuzz(func(t *testing.T, arm64 bool, code []byte) {
		arch := elf.EM_X86_64
		if arm64 {
			arch = elf.EM_AARCH64
		}
		l, err := tsdDecode(arch, code)
		if err != nil {
			if !errors.Is(err, ErrTSDCode) {
				t.Fatalf("error %v is not ErrTSDCode", err)
			}
			return
		}
		ok := l.MaxFastKey > 0 && l.MaxFastKey <= MaxKeys
		switch l.Libc {
		case LibcGlibc:
			ok = ok && l.EntrySize == 16 && l.DataOffset == 8 && !l.BlockDeref
		case LibcMusl:
			ok = ok && l.EntrySize == 8 && l.DataOffset == 0 && l.BlockDeref
		default:
			ok = false
		}
		if !ok {
			t.Fatalf("implausible layout %+v", l)
		}
		_, _ = l.SlotAddress(tsdMemory{}, 0x7f0000001000, 0)
	})
}
