package support

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"reflect"
	"slices"
	"strings"

	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// The records user space writes into the stack-delta and mapping maps; their
// layout is checked against the BPF object's BTF (checkDeltaLayout).

// DeltaCapacity is what the process manager needs to know to fill the
// stack-delta maps: their sizes and layout constants.
type DeltaCapacity struct {
	Rules, Deltas uint32
	// PageBits: a delta page covers 1 << PageBits addresses.
	PageBits uint
	// DeltasPerSlot: the pool is written in slots of this many deltas, so
	// every file's run of deltas must start at a multiple of it (0 means
	// 1).
	DeltasPerSlot uint32
	// FlagRASigned is the rule flag for a signed return address,
	// FlagStackSwitch the one for a frame that switched stacks.
	FlagRASigned, FlagStackSwitch uint8
}

// FileKey mirrors struct file_key: a file as the kernel names it.
type FileKey struct {
	Dev, Ino uint64
}

// NewFileKey returns the key of the file with user-space device number dev
// (as stat and /proc/PID/maps give it) and inode ino. The kernel encodes
// devices as MAJOR << 20 | MINOR.
func NewFileKey(dev, ino uint64) FileKey {
	return FileKey{Dev: uint64(unix.Major(dev))<<20 | uint64(unix.Minor(dev)), Ino: ino}
}

// KnownFile mirrors struct known_file.
type KnownFile struct {
	FileID      uint64
	VaddrAdjust int64
	TextVaddr   uint64
}

// UnwindRule mirrors struct unwind_rule.
type UnwindRule struct {
	CFABase uint8
	Flags   uint8
	// Runtime is the runtime whose eval loop the frame runs, 0 for none.
	Runtime   uint8
	_         uint8
	CFAOffset int32
	FPOffset  int32
	RAOffset  int32
}

// DeltaSlot mirrors struct delta_slot, an element of the stack_deltas
// pool.
type DeltaSlot [2]StackDelta

// StackDelta mirrors struct stack_delta.
type StackDelta struct {
	AddrLow uint16
	Rule    uint16
}

// DeltaPageKey mirrors struct delta_page_key.
type DeltaPageKey struct {
	FileID uint64
	Page   uint64
}

// DeltaPage mirrors struct delta_page.
type DeltaPage struct {
	First uint32
	Count uint32
}

// PidMappingKey mirrors struct pid_mapping_key, an LPM trie key.
type PidMappingKey struct {
	PrefixLen uint32
	PID       uint32
	// AddrBE holds the address in big-endian byte order, as the trie
	// compares keys byte by byte.
	AddrBE uint64
}

// PidMapping mirrors struct pid_mapping.
type PidMapping struct {
	FileID uint64
	Bias   uint64
	// Runtime is the runtime whose unwinder takes over at PCs of the
	// mapping (its JIT code), 0 for none.
	Runtime uint8
	_       [7]uint8
}

// RuntimeProcKey mirrors struct runtime_proc_key.
type RuntimeProcKey struct {
	PID     uint32
	Runtime uint32
}

// RuntimeProcSize is the room for one runtime's per-process configuration
// (RUNTIME_PROC_SIZE), checked against struct runtime_proc.
const RuntimeProcSize = 128

// RuntimeProc mirrors struct runtime_proc: a runtime's own struct,
// encoded.
type RuntimeProc [RuntimeProcSize]byte

// pidMappingFixedBits is the part of a PidMappingKey's prefix that is the
// pid: every prefix covers one pid entirely.
const pidMappingFixedBits = 32

// NewPidMappingKey is the trie key for the addresses of pid that share
// their first addrBits bits with addr.
func NewPidMappingKey(pid uint32, addr uint64, addrBits int) PidMappingKey {
	return PidMappingKey{
		PrefixLen: uint32(pidMappingFixedBits + addrBits),
		PID:       pid,
		// Stored in host (little-endian) order by the map code, so swap to
		// get big-endian bytes in memory.
		AddrBE: bits.ReverseBytes64(addr),
	}
}

// mirrors pairs each C struct user space writes or reads with its Go
// mirror.
var mirrors = map[string]any{
	"unwind_rule":      UnwindRule{},
	"stack_delta":      StackDelta{},
	"delta_slot":       DeltaSlot{},
	"delta_page_key":   DeltaPageKey{},
	"delta_page":       DeltaPage{},
	"pid_mapping_key":  PidMappingKey{},
	"pid_mapping":      PidMapping{},
	"file_key":         FileKey{},
	"known_file":       KnownFile{},
	"runtime_proc_key": RuntimeProcKey{},
	"runtime_proc":     RuntimeProc{},
	"apm_proc":         APMProc{},
	"apm_context":      apmContext{},
	"go_proc":          GoProc{},
	"label":            label{},
	"thread_ctx_proc":  ThreadCtxProc{},
}

// checkMirrors makes sure each Go mirror has its C struct's layout.
func checkMirrors(types *btf.Spec) error {
	for name, mirror := range mirrors {
		if err := checkMirror(types, name, mirror); err != nil {
			return err
		}
	}
	return nil
}

// checkMirror makes sure a Go mirror has its C struct's size and the
// offsets of its fields, in order (padding fields aside: "pad..." in C,
// "_" in Go).
func checkMirror(types *btf.Spec, name string, mirror any) error {
	var st *btf.Struct
	if err := types.TypeByName(name, &st); err != nil {
		return fmt.Errorf("BPF object lacks struct %s: %w", name, err)
	}
	got := []uintptr{uintptr(st.Size)}
	for _, m := range st.Members {
		if !strings.HasPrefix(m.Name, "pad") {
			got = append(got, uintptr(m.Offset.Bytes()))
		}
	}
	if want := goLayout(reflect.TypeOf(mirror)); !slices.Equal(got, want) {
		return fmt.Errorf("struct %s has size and offsets %v, the Go mirror %v", name, got, want)
	}
	return nil
}

// CheckMirror makes sure a Go mirror of a C struct the object's BTF
// describes has the C layout: for runtimes' per-process configurations.
func (s *Shared) CheckMirror(name string, mirror any) error {
	if err := checkMirror(s.types, name, mirror); err != nil {
		return err
	}
	if err := explicitPadding(name, mirror); err != nil {
		return err
	}
	if size := reflect.TypeOf(mirror).Size(); size > RuntimeProcSize {
		return fmt.Errorf("struct %s takes %d bytes, more than the %d of struct runtime_proc", name, size, RuntimeProcSize)
	}
	return nil
}

// explicitPadding makes sure a runtime's configuration mirror encodes to
// its own size: it is written with encoding/binary, which leaves out Go's
// implicit padding, so a mirror must spell its padding out ("_" fields) or
// its later fields land short of their C offsets.
func explicitPadding(name string, mirror any) error {
	if n, size := binary.Size(mirror), reflect.TypeOf(mirror).Size(); n != int(size) {
		return fmt.Errorf("struct %s's Go mirror encodes to %d bytes, not its size %d: declare its padding as _ fields", name, n, size)
	}
	return nil
}

// EnumValues returns the values of an enum of the object's BTF by name:
// for runtimes' own enums.
func (s *Shared) EnumValues(name string) (map[string]uint64, error) { return enumValues(s.types, name) }

// goLayout is a Go struct's size and the offsets of its named fields; an
// array (DeltaSlot) counts as one field at 0.
func goLayout(t reflect.Type) []uintptr {
	out := []uintptr{t.Size()}
	if t.Kind() != reflect.Struct {
		return append(out, 0)
	}
	for i := range t.NumField() {
		if f := t.Field(i); f.Name != "_" {
			out = append(out, f.Offset)
		}
	}
	return out
}
