package processmanager

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/hostprof/ebpf-profiler/libpf"
	"github.com/hostprof/ebpf-profiler/processmanager/execinfo"
	proc "github.com/hostprof/ebpf-profiler/processmanager/process"
)

// kallsyms is the kernel's table of text symbols, sorted by address.
type kallsyms struct {
	syms  []ksym
	names string
	// modules holds module names; index 0 is the kernel image itself.
	modules []moduleRange
	// hidden is set when the addresses read as zero: kptr_restrict hides
	// them from us, so nothing can be symbolized.
	hidden bool
	// digest is the hash of the text the table was parsed from.
	digest uint64
}

// ksym is kept to 16 bytes: a kernel has over 100k text symbols.
type ksym struct {
	addr    uint64
	nameOff uint32
	// nameLen fits: kernel symbol names are at most KSYM_NAME_LEN (512).
	// paddingFlag is set in it for a padding symbol.
	nameLen uint16
	module  uint16
}

// x86 kernels built with call padding (CONFIG_CALL_PADDING) list a
// padding symbol "__pfx_NAME" right before each
// function NAME: half of all text symbols. A padding symbol keeps its entry
// (an address there is not the previous function's) but stores no name of
// its own: it shares its function's, with paddingFlag set in nameLen.
const (
	paddingPrefix = "__pfx_"
	paddingFlag   = 1 << 13
)

// moduleRange is a module's name and the span of its text symbols.
type moduleRange struct {
	name      string
	low, high uint64
}

// vmlinuxName is the mapping path of the kernel image's frames.
const vmlinuxName = "vmlinux"

// parseKallsyms reads /proc/kallsyms text symbols: lines of
// "address type name [module]" where type is t, T, w or W. The kernel lists
// them mostly but not entirely sorted (modules follow the image), so the
// table is sorted here.
func parseKallsyms(r io.Reader) (*kallsyms, error) {
	k := &kallsyms{modules: []moduleRange{{name: vmlinuxName}}}
	moduleIndex := map[string]uint16{}
	// While parsing, a symbol's type rank (its preference among symbols
	// at one address) sits in the top bits of nameLen: a kernel has over
	// 100k text symbols, and a second array of them was megabytes more.
	const rankShift = 14
	// prev is the name of the last symbol stored, to share a padding
	// symbol's name with the function it pads.
	var prev ksym
	// Grown by doubling: append grows large slices by a quarter, and
	// copied the megabytes of names five times over.
	syms := make([]ksym, 0, 1<<16)
	names := make([]byte, 0, 1<<20)
	nonZero := false

	s := bufio.NewScanner(r)
	for lineNo := 1; s.Scan(); lineNo++ {
		line := s.Bytes()
		addrStr, rest, ok1 := bytes.Cut(line, []byte{' '})
		typ, rest, ok2 := bytes.Cut(rest, []byte{' '})
		if !ok1 || !ok2 || len(typ) != 1 {
			return nil, fmt.Errorf("kallsyms line %d %q: malformed", lineNo, line)
		}
		rank := strings.IndexByte("TtWw", typ[0])
		if rank < 0 {
			continue
		}
		addr, err := parseHex(addrStr)
		if err != nil {
			return nil, fmt.Errorf("kallsyms line %d: address: %w", lineNo, err)
		}
		nonZero = nonZero || addr != 0
		name, module, _ := bytes.Cut(rest, []byte{'\t'})
		name = bytes.TrimSpace(name)
		module = bytes.TrimSuffix(bytes.TrimPrefix(bytes.TrimSpace(module), []byte{'['}), []byte{']'})
		var modIdx uint16
		if len(module) > 0 {
			idx, ok := moduleIndex[string(module)]
			if !ok {
				if len(k.modules) > math.MaxUint16 {
					return nil, fmt.Errorf("kallsyms line %d: more than %d modules", lineNo, math.MaxUint16)
				}
				idx = uint16(len(k.modules))
				moduleIndex[string(module)] = idx
				k.modules = append(k.modules, moduleRange{name: string(module), low: ^uint64(0)})
			}
			modIdx = idx
		}
		var flags uint16
		if padded, ok := bytes.CutPrefix(name, []byte(paddingPrefix)); ok && len(padded) > 0 {
			name, flags = padded, paddingFlag
		}
		if len(name) >= paddingFlag {
			return nil, fmt.Errorf("kallsyms line %d: name of %d bytes is too long", lineNo, len(name))
		}
		sym := ksym{addr, uint32(len(names)), uint16(len(name)), modIdx}
		if prev.nameLen&paddingFlag != 0 && prev.nameLen&^paddingFlag == sym.nameLen &&
			bytes.Equal(names[prev.nameOff:prev.nameOff+uint32(sym.nameLen)], name) {
			sym.nameOff = prev.nameOff
		} else {
			if len(names)+len(name) > math.MaxUint32 {
				return nil, fmt.Errorf("kallsyms line %d: names exceed 4 GiB", lineNo)
			}
			if cap(names)-len(names) < len(name) {
				names = slices.Grow(names, cap(names))
			}
			names = append(names, name...)
		}
		sym.nameLen |= flags
		prev = sym
		if len(syms) == cap(syms) {
			syms = slices.Grow(syms, cap(syms))
		}
		sym.nameLen |= uint16(rank) << rankShift
		syms = append(syms, sym)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading kallsyms: %w", err)
	}
	// A copy of exactly their size: names are megabytes.
	k.names = string(names)
	if !nonZero {
		k.hidden = len(syms) > 0
		return k, nil
	}
	slices.SortStableFunc(syms, func(a, b ksym) int {
		return cmp.Or(cmp.Compare(a.addr, b.addr), cmp.Compare(a.nameLen>>rankShift, b.nameLen>>rankShift))
	})
	syms = slices.CompactFunc(syms, func(a, b ksym) bool { return a.addr == b.addr })
	k.syms = syms
	if cap(syms) > len(syms)+len(syms)/4 {
		k.syms = slices.Clone(syms) // the appends' spare room is megabytes
	}
	k.modules[0].low = ^uint64(0)
	for i := range k.syms {
		s := &k.syms[i]
		s.nameLen &= 1<<rankShift - 1
		m := &k.modules[s.module]
		m.low, m.high = min(m.low, s.addr), max(m.high, s.addr)
	}
	return k, nil
}

// parseHex parses a kallsyms address: hexadecimal digits, at most 16.
func parseHex(b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 16 {
		return 0, fmt.Errorf("%q is not a 64-bit hexadecimal number", b)
	}
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, fmt.Errorf("%q is not a 64-bit hexadecimal number", b)
		}
		v = v<<4 | uint64(c)
	}
	return v, nil
}

// maxKernelSymbolSize bounds how far past its start a kernel symbol is
// believed to extend. kallsyms has no sizes, so without a bound an address
// past the last module, or a stray user address, would be credited to
// whichever symbol precedes it.
const maxKernelSymbolSize = 1 << 20

// lookup returns the symbol containing addr and the index of its module. A
// kernel symbol extends to the next one.
func (k *kallsyms) lookup(addr uint64) (name string, module uint32, ok bool) {
	i, found := slices.BinarySearchFunc(k.syms, addr, func(s ksym, a uint64) int { return cmp.Compare(s.addr, a) })
	if !found {
		i--
	}
	if i < 0 || addr-k.syms[i].addr >= maxKernelSymbolSize {
		return "", 0, false
	}
	s := &k.syms[i]
	name = k.names[s.nameOff : s.nameOff+uint32(s.nameLen&^paddingFlag)]
	if s.nameLen&paddingFlag != 0 {
		name = paddingPrefix + name
	}
	return name, uint32(s.module), true
}

// kernel symbolizes kernel frames: kallsyms for names, sysfs notes for the
// build ids that become file ids.
type kernel struct {
	sysFS   string
	syms    *kallsyms
	vmlinux *libpf.Mapping
	// modules caches module mappings by name; built lazily because reading
	// a module's build id costs a file read.
	modules map[string]*libpf.Mapping
}

// loadKallsyms reads and parses the kernel's symbols.
func loadKallsyms(src proc.Source) (*kallsyms, error) {
	f, err := src.Kallsyms()
	if err != nil {
		return nil, fmt.Errorf("opening kallsyms: %w", err)
	}
	defer f.Close()
	hasher := xxh3.New()
	k, err := parseKallsyms(io.TeeReader(f, hasher))
	if err != nil {
		return nil, err
	}
	k.digest = hasher.Sum64()
	return k, nil
}

// newKernel builds the kernel symbolizer from a parsed table; the kernel's
// build id comes from sysFS/kernel/notes.
func newKernel(sysFS string, syms *kallsyms) (*kernel, error) {
	k := &kernel{sysFS: sysFS, syms: syms, modules: map[string]*libpf.Mapping{}}
	k.vmlinux = &libpf.Mapping{Path: vmlinuxName}
	if len(syms.syms) > 0 && syms.modules[0].high != 0 {
		k.vmlinux.Start, k.vmlinux.End = syms.modules[0].low, syms.modules[0].high
	}
	notes, err := os.ReadFile(sysFS + "/kernel/notes")
	if err == nil {
		k.vmlinux.GNUBuildID, err = execinfo.GNUBuildIDFromNotes(notes)
	}
	if err != nil {
		return k, fmt.Errorf("kernel build id: %w", err)
	}
	k.vmlinux.FileID = libpf.FileIDFromKernelBuildID(k.vmlinux.GNUBuildID)
	return k, nil
}

// frame converts one kernel address. Addresses stay absolute (Bias 0): the
// kernel image and modules are mapped once, at one address, for everyone.
func (k *kernel) frame(addr uint64, returnAddress bool) libpf.Frame {
	if returnAddress && addr > 0 {
		addr--
	}
	f := libpf.Frame{Kind: libpf.FrameKernel, Address: addr, Mapping: k.vmlinux}
	name, module, ok := k.syms.lookup(addr)
	if !ok {
		return f
	}
	f.FunctionName = name
	if module != 0 {
		f.Mapping = k.module(module)
	}
	return f
}

// tracingFrames is how many of an off-CPU trace's first frames are the BPF
// program and the tracepoint machinery that took its stack: they top every
// such stack, above the scheduler, and say nothing of the wait. They end
// at the last of the first few frames named as such: the BPF program has
// no name where the kernel does not list programs in kallsyms
// (net.core.bpf_jit_kallsyms=0). Without kernel symbols none is dropped.
func tracingFrames(frames []libpf.Frame) int {
	n := 0
	for i := 0; i < min(len(frames), 8) && frames[i].Kind == libpf.FrameKernel; i++ {
		if name := frames[i].FunctionName; strings.HasPrefix(name, "bpf_prog_") ||
			strings.HasPrefix(name, "bpf_trace_run") || strings.HasPrefix(name, "__bpf_trace_") ||
			strings.HasPrefix(name, "__traceiter_") {
			n = i + 1
		}
	}
	return n
}

// module returns the shared mapping of a module, reading its build id from
// sysfs the first time. Its path is the module's name in brackets,
// "[nf_tables]", as perf names modules. Pseudo modules such as [bpf] or
// [__builtin__ftrace] have no build id and get a zero file id.
func (k *kernel) module(idx uint32) *libpf.Mapping {
	r := &k.syms.modules[idx]
	if m, ok := k.modules[r.name]; ok {
		return m
	}
	m := &libpf.Mapping{Path: "[" + r.name + "]", Start: r.low, End: r.high}
	notes, err := os.ReadFile(fmt.Sprintf("%s/module/%s/notes/.note.gnu.build-id", k.sysFS, r.name))
	if err == nil {
		if id, err := execinfo.GNUBuildIDFromNotes(notes); err == nil {
			m.GNUBuildID = id
			m.FileID = libpf.FileIDFromKernelBuildID(id)
		}
	}
	k.modules[r.name] = m
	return m
}
