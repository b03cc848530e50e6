package python

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestThreadStateKey(t *testing.T) {
	const runtime, bias = 0x500000, 0x7f0000000000
	off37, err := offsetsFor("amd64", Version{Major: 3, Minor: 7})
	if err != nil {
		t.Fatal(err)
	}
	in := &Interpreter{Version: Version{Major: 3, Minor: 7}, Runtime: runtime}
	loc, err := FindThreadStateKey(nil, in, off37)
	if err != nil {
		t.Fatal(err)
	}
	tss := bias + runtime + uint64(off37.Runtime.AutoTSSKey)
	tssBytes := func(init, key uint32) []byte {
		b := make([]byte, off37.TSS.Size)
		binary.LittleEndian.PutUint32(b[off37.TSS.IsInitialized:], init)
		binary.LittleEndian.PutUint32(b[off37.TSS.Key:], key)
		return b
	}
	for _, tc := range []struct {
		name    string
		mem     tsdMemory
		want    uint32
		wantErr error
		errText string
	}{
		{name: "created", mem: tsdMemory{tss: tssBytes(1, 7)}, want: 7},
		{name: "not created", mem: tsdMemory{tss: tssBytes(0, 0)}, wantErr: ErrNoThreadStateKey},
		{name: "implausible", mem: tsdMemory{tss: tssBytes(1, 5000)}, errText: "5000"},
		{name: "unmapped", mem: tsdMemory{}, errText: "no memory"},
	} {
		got, err := ThreadStateKey(loc, tc.mem, bias)
		switch {
		case tc.wantErr == nil && tc.errText == "":
			if err != nil || got != tc.want {
				t.Errorf("%s: %d, %v; want %d", tc.name, got, err, tc.want)
			}
		case err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText):
			t.Errorf("%s: %d, %v; want an error %v mentioning %q", tc.name, got, err, tc.wantErr, tc.errText)
		}
	}

	// 3.6: a static int, -1 until the key is created.
	loc36 := ThreadStateKeyLocation{Key: 0x2acf00, KeySize: 4}
	minus1 := binary.LittleEndian.AppendUint32(nil, 0xffffffff)
	if _, err := ThreadStateKey(loc36, tsdMemory{bias + 0x2acf00: minus1}, bias); !errors.Is(err, ErrNoThreadStateKey) {
		t.Errorf("3.6 autoTLSkey -1: %v, want ErrNoThreadStateKey", err)
	}
	if k, err := ThreadStateKey(loc36, tsdMemory{bias + 0x2acf00: {2, 0, 0, 0}}, bias); err != nil || k != 2 {
		t.Errorf("3.6 autoTLSkey 2: %d, %v", k, err)
	}
}

// TestFindThreadStateKey36 finds autoTLSkey in pyenv's 3.6 and refuses the
// same file stripped of .symtab.
func TestFindThreadStateKey36(t *testing.T) {
	path := "/root/.pyenv/versions/3.6.15/lib/libpython3.6m.so.1.0"
	f, err := elf.Open(path)
	if err != nil {
		t.Skipf("no pyenv CPython 3.6: %v", err)
	}
	defer f.Close()
	in, err := Detect(f)
	if err != nil {
		t.Fatal(err)
	}
	off, err := offsetsFor("amd64", in.Version)
	if err != nil {
		t.Fatal(err)
	}
	loc, err := FindThreadStateKey(f, in, off)
	if err != nil || loc.Key == 0 || loc.Initialized != 0 {
		t.Fatalf("%s: %+v, %v", path, loc, err)
	}
	stripped := tsdStripSymtab(t, path)
	if _, err := FindThreadStateKey(stripped, in, off); err == nil || !strings.Contains(err.Error(), TLSKeySymbol) {
		t.Errorf("stripped 3.6: %v, want an error naming %s", err, TLSKeySymbol)
	}
}

// tsdStripSymtab returns a copy of the ELF file at path without .symtab,
// made by objcopy --strip-all.
func tsdStripSymtab(t *testing.T, path string) *elf.File {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if msg, err := exec.Command("objcopy", "--strip-all", path, out).CombinedOutput(); err != nil {
		t.Fatalf("objcopy --strip-all %s: %v\n%s", path, err, msg)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// tsdMemory is process memory for tests: bytes at addresses.
type tsdMemory map[uint64][]byte

func (m tsdMemory) ReadAt(p []byte, off int64) (int, error) {
	for at, b := range m {
		if uint64(off) >= at && uint64(off)+uint64(len(p)) <= at+uint64(len(b)) {
			return copy(p, b[uint64(off)-at:]), nil
		}
	}
	return 0, fmt.Errorf("no memory at %#x", off)
}
