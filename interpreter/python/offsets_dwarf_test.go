package python

import (
	"debug/dwarf"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"

	"github.com/hostprof/ebpf-profiler/interpreter/internal/dwarftest"
)

// fieldSource is the C member behind one value of the table (generated
// into offsets_table_sources_test.go). Kind is as in utils/pyoffsets: o
// offsetof, s sizeof, m size of the member, e enumerator, b bit-field
// shift, w bit-field width.
type fieldSource struct{ Field, Kind, CType, Member string }

// offDWARFTarget is a CPython binary whose DWARF describes its structs.
type offDWARFTarget struct {
	name    string // subtest name
	version Version
	debug   string // the file with .debug_info; "" if not installed
	pkg     string // what installs debug, for the skip message
}

// TestOffsetsMatchDWARF reads the layout of every struct member behind
// the table from the DWARF of CPythons on this machine, built separately
// from the headers the table was compiled from: Debian's python3.X (with
// python3.X-dbg installed) and pyenv's libpython (built with -g).
func TestOffsetsMatchDWARF(t *testing.T) {
	targets := offDWARFTargets()
	if len(targets) == 0 {
		t.Skip("no CPython 3 here: install python3.11 and python3.11-dbg (Debian), or CPythons with pyenv")
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			if tg.debug == "" {
				t.Skipf("no DWARF for CPython %s: install %s", tg.version.MajorMinor(), tg.pkg)
			}
			o, err := offsetsFor(runtime.GOARCH, tg.version)
			if err != nil {
				t.Skipf("not in the table: %v", err)
			}
			sources, ok := generatedSources[tg.version]
			if !ok {
				t.Fatalf("the table has %s but no sources for it: run go generate", tg.version.MajorMinor())
			}
			idx, err := offIndexDWARF(tg.debug, sources)
			if err != nil {
				t.Fatal(err)
			}
			leaves := offLeaves(o)
			for _, s := range sources {
				got, err := idx.value(s)
				if err != nil {
					t.Errorf("%s (%s %s): %v", s.Field, s.CType, s.Member, err)
				} else if got != leaves[s.Field] {
					t.Errorf("%s (%s %s) is %d in the table, %d in the DWARF of %s",
						s.Field, s.CType, s.Member, leaves[s.Field], got, tg.debug)
				}
			}
			if !t.Failed() {
				t.Logf("%d values match the DWARF of %s", len(sources), tg.debug)
			}
		})
	}
}

var offDebianPython = regexp.MustCompile(`^python3\.(\d+)$`)

func offDWARFTargets() []offDWARFTarget {
	var ts []offDWARFTarget
	bins, _ := filepath.Glob("/usr/bin/python3.*")
	for _, bin := range bins {
		m := offDebianPython.FindStringSubmatch(filepath.Base(bin))
		if m == nil {
			continue
		}
		var minor int
		fmt.Sscan(m[1], &minor)
		ts = append(ts, offDWARFTarget{
			name:    "system-" + filepath.Base(bin),
			version: Version{Major: 3, Minor: minor},
			debug:   offDebugFile(bin),
			pkg:     filepath.Base(bin) + "-dbg",
		})
	}
	if dir := offPyenvVersions(); dir != "" {
		libs, _ := filepath.Glob(filepath.Join(dir, "3.*.*", "lib", "libpython3.*.so.1.0"))
		for _, lib := range libs {
			release := filepath.Base(filepath.Dir(filepath.Dir(lib)))
			var v Version
			if _, err := fmt.Sscanf(release, "%d.%d.", &v.Major, &v.Minor); err != nil || !offHasDWARF(lib) {
				continue
			}
			ts = append(ts, offDWARFTarget{name: "pyenv-" + release, version: v, debug: lib})
		}
	}
	return ts
}

// offDebugFile is the file holding bin's DWARF: bin itself, or the
// separate debug file named by its GNU build id.
func offDebugFile(bin string) string {
	if offHasDWARF(bin) {
		return bin
	}
	f, err := elf.Open(bin)
	if err != nil {
		return ""
	}
	defer f.Close()
	note := f.Section(".note.gnu.build-id")
	if note == nil {
		return ""
	}
	b, err := note.Data()
	// An ELF note: namesz, descsz, type, the name padded to 4 bytes
	// ("GNU\0"), then the id.
	if err != nil || len(b) < 12 {
		return ""
	}
	namesz, descsz := f.ByteOrder.Uint32(b), f.ByteOrder.Uint32(b[4:])
	start := 12 + (namesz+3)&^3
	if descsz < 2 || uint64(start)+uint64(descsz) > uint64(len(b)) {
		return ""
	}
	id := hex.EncodeToString(b[start : start+descsz])
	path := filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")
	if !offHasDWARF(path) {
		return ""
	}
	return path
}

func offHasDWARF(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	s := f.Section(".debug_info")
	return s != nil && s.Type != elf.SHT_NOBITS
}

// offDWARFIndex finds the named types of one binary's DWARF.
type offDWARFIndex struct {
	d     *dwarf.Data
	types map[string][]dwarf.Offset // "PyThreadState", "enum _frameowner"
}

// offIndexDWARF records where the types the sources name are defined,
// reading only the top level of each compile unit, where C's file-scope
// types are.
func offIndexDWARF(path string, sources []fieldSource) (*offDWARFIndex, error) {
	d, err := dwarftest.Read(path)
	if err != nil {
		return nil, err
	}
	wanted := map[string]bool{}
	for _, s := range sources {
		wanted[s.CType] = true
	}
	idx := &offDWARFIndex{d: d, types: map[string][]dwarf.Offset{}}
	prefixes := map[dwarf.Tag]string{dwarf.TagTypedef: "", dwarf.TagStructType: "struct ",
		dwarf.TagUnionType: "union ", dwarf.TagEnumerationType: "enum "}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if e == nil {
			break
		}
		if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit || e.Tag == 0 {
			continue
		}
		prefix, isType := prefixes[e.Tag]
		name, _ := e.Val(dwarf.AttrName).(string)
		if isType && wanted[prefix+name] && e.Val(dwarf.AttrDeclaration) == nil {
			idx.types[prefix+name] = append(idx.types[prefix+name], e.Offset)
		}
		if e.Children {
			r.SkipChildren()
		}
	}
	return idx, nil
}

// lookup returns the first complete definition of ctype: a typedef may
// name a struct that its compile unit only declares.
func (x *offDWARFIndex) lookup(ctype string) (dwarf.Type, error) {
	for _, off := range x.types[ctype] {
		t, err := x.d.Type(off)
		if err != nil {
			return nil, err
		}
		if st, ok := dwarftest.Unwrap(t).(*dwarf.StructType); ok && st.Incomplete {
			continue
		}
		return t, nil
	}
	return nil, fmt.Errorf("no definition of %s", ctype)
}

// value is what the DWARF says the value behind s is.
func (x *offDWARFIndex) value(s fieldSource) (int, error) {
	t, err := x.lookup(s.CType)
	if err != nil {
		return 0, err
	}
	switch s.Kind {
	case "s":
		return int(t.Size()), nil
	case "e":
		return offEnumerator(t, s.Member)
	}
	f, at, err := dwarftest.Member(t, s.Member)
	if err != nil {
		return 0, err
	}
	switch s.Kind {
	case "o":
		return int(at), nil
	case "m":
		return int(f.Type.Size()), nil
	case "b":
		if f.BitSize == 0 {
			return 0, fmt.Errorf("%s is not a bit-field", s.Member)
		}
		if f.DataBitOffset == 0 && f.BitOffset != 0 { // DWARF 2 and 3: big-endian bit numbering
			return int(f.ByteOffset*8 + f.ByteSize*8 - f.BitOffset - f.BitSize), nil
		}
		return int(f.DataBitOffset), nil
	case "w":
		return int(f.BitSize), nil
	}
	return 0, fmt.Errorf("unknown kind %q", s.Kind)
}

func offEnumerator(t dwarf.Type, name string) (int, error) {
	et, ok := dwarftest.Unwrap(t).(*dwarf.EnumType)
	if !ok {
		return 0, fmt.Errorf("%s is not an enum", t)
	}
	for _, v := range et.Val {
		if v.Name == name {
			return int(v.Val), nil
		}
	}
	return 0, fmt.Errorf("no enumerator %s in %s", name, t)
}
