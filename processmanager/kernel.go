package processmanager

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/hostprof/ebpf-profiler/libpf"
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
}

// ksym is kept to 16 bytes: a kernel has over 100k text symbols.
type ksym struct {
	addr    uint64
	nameOff uint32
	// nameLen fits: kernel symbol names are at most KSYM_NAME_LEN (512).
	nameLen uint16
	module  uint16
}

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
	type rankedSym struct {
		ksym
		rank int
	}
	var syms []rankedSym
	var names strings.Builder
	nonZero := false

	s := bufio.NewScanner(r)
	for lineNo := 1; s.Scan(); lineNo++ {
		line := s.Text()
		addrStr, rest, ok1 := strings.Cut(line, " ")
		typ, rest, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 || len(typ) != 1 {
			return nil, fmt.Errorf("kallsyms line %d %q: malformed", lineNo, line)
		}
		rank := strings.IndexByte("TtWw", typ[0])
		if rank < 0 {
			continue
		}
		addr, err := strconv.ParseUint(addrStr, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("kallsyms line %d: address: %w", lineNo, err)
		}
		nonZero = nonZero || addr != 0
		name, module, _ := strings.Cut(rest, "\t")
		name = strings.TrimSpace(name)
		module = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(module), "["), "]")
		var modIdx uint16
		if module != "" {
			idx, ok := moduleIndex[module]
			if !ok {
				if len(k.modules) > math.MaxUint16 {
					return nil, fmt.Errorf("kallsyms line %d: more than %d modules", lineNo, math.MaxUint16)
				}
				idx = uint16(len(k.modules))
				moduleIndex[module] = idx
				k.modules = append(k.modules, moduleRange{name: module, low: ^uint64(0)})
			}
			modIdx = idx
		}
		off := names.Len()
		if off+len(name) > math.MaxUint32 || len(name) > math.MaxUint16 {
			return nil, fmt.Errorf("kallsyms line %d: name too long or names exceed 4 GiB", lineNo)
		}
		names.WriteString(name)
		syms = append(syms, rankedSym{ksym{addr, uint32(off), uint16(len(name)), modIdx}, rank})
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading kallsyms: %w", err)
	}
	// Clone drops the builder's spare capacity: names are megabytes.
	k.names = strings.Clone(names.String())
	if !nonZero {
		k.hidden = len(syms) > 0
		return k, nil
	}
	slices.SortStableFunc(syms, func(a, b rankedSym) int {
		return cmp.Or(cmp.Compare(a.addr, b.addr), cmp.Compare(a.rank, b.rank))
	})
	syms = slices.CompactFunc(syms, func(a, b rankedSym) bool { return a.addr == b.addr })
	k.syms = make([]ksym, len(syms))
	k.modules[0].low = ^uint64(0)
	for i, s := range syms {
		k.syms[i] = s.ksym
		m := &k.modules[s.module]
		m.low, m.high = min(m.low, s.addr), max(m.high, s.addr)
	}
	return k, nil
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
	return k.names[s.nameOff : s.nameOff+uint32(s.nameLen)], uint32(s.module), true
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

// loadKallsyms reads and parses procFS/kallsyms.
func loadKallsyms(procFS string) (*kallsyms, error) {
	f, err := os.Open(procFS + "/kallsyms")
	if err != nil {
		return nil, fmt.Errorf("opening kallsyms: %w", err)
	}
	defer f.Close()
	return parseKallsyms(f)
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
		k.vmlinux.GNUBuildID, err = gnuBuildIDFromNotes(notes)
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
		if id, err := gnuBuildIDFromNotes(notes); err == nil {
			m.GNUBuildID = id
			m.FileID = libpf.FileIDFromKernelBuildID(id)
		}
	}
	k.modules[r.name] = m
	return m
}
