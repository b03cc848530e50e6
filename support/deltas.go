package support

import (
	"fmt"
	"math/bits"

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
}

// UnwindRule mirrors struct unwind_rule.
type UnwindRule struct {
	CFABase   uint8
	Flags     uint8
	_         uint16
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
}

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

// checkDeltaLayout makes sure the Go mirrors have the C structs' sizes and
// field offsets.
func checkDeltaLayout(types *btf.Spec) error {
	for name, want := range map[string][]int{
		// Size, then the offsets of the named fields in order.
		"unwind_rule":     {16, 0, 1, 4, 8, 12},
		"stack_delta":     {4, 0, 2},
		"delta_slot":      {8, 0},
		"delta_page_key":  {16, 0, 8},
		"delta_page":      {8, 0, 4},
		"pid_mapping_key": {16, 0, 4, 8},
		"pid_mapping":     {16, 0, 8},
		"file_key":        {16, 0, 8},
		"known_file":      {16, 0, 8},
	} {
		var st *btf.Struct
		if err := types.TypeByName(name, &st); err != nil {
			return fmt.Errorf("BPF object lacks struct %s: %w", name, err)
		}
		got := []int{int(st.Size)}
		for _, m := range st.Members {
			if m.Name == "pad" {
				continue
			}
			got = append(got, int(m.Offset.Bytes()))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("struct %s has size and offsets %v, the Go mirror %v", name, got, want)
		}
	}
	return nil
}
