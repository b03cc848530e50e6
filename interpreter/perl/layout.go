package perl

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Layout is where a Perl version keeps what the unwinder and the
// symbolizer read: byte offsets into its structs, LP64 with ithreads.
// Sources: internals.md §3-§6 and §12, which cite the headers (intrpvar.h,
// cop.h, sv.h, cv.h, gv.h, hv.h) at each release tag; 5.32, 5.36, 5.40 and
// 5.42 were checked against Debian's builds (perl-debug's DWARF, live
// processes; 5.32-5.40 also offsetof against their own CORE headers and
// config.h), 5.34 and 5.38 only against the tags' headers with a borrowed
// config.h. x86_64 and arm64 differ only in struct interpreter's size (its
// JMPENV, after what we read, is larger on arm64; perl-debug's DWARF of
// Debian's arm64 builds, internals.md §11).
type Layout struct {
	// struct interpreter: Icurcop and Icurstackinfo (§3), and its size in
	// the Debian build checked for the architecture (PL_interp_size; 0
	// where none was).
	InterpCurcop, InterpCurstackinfo, InterpSize uint64

	// struct stackinfo: si_cxstack, si_prev, si_cxix, si_cxmax, si_type
	// (§4).
	SICxstack, SIPrev, SICxix, SICxmax, SIType uint64
	// struct context: its size, cx_type, blk_oldcop, blk_sub.retop and
	// blk_sub.cv (§4).
	CXSize, CXType, CXOldcop, CXRetop, CXCV uint64

	// struct cop: cop_line (u32) and cop_file (§5).
	COPLine, COPFile uint64

	// XPVCV (from the body, sv_any): xcv_stash, xcv_gv_u, xcv_flags (§6).
	CVStash, CVGv, CVFlags uint64
	// XPVGV: the name's HEK and GvSTASH; GP's gp_egv.
	GVNameHEK, GVStash, GPEgv uint64
	// HvAUX: in the body at HvAuxBody (5.36+), else after HvARRAY's
	// xhv_max+1 buckets (xhv_max in the body at HvMax); its name (a HEK,
	// or an array of them) and xhv_name_count.
	HvAuxBody, HvMax, AuxName, AuxNameCount uint64
}

// Values every Perl 5.32-5.42 shares (internals.md §4-§6, §12).
const (
	// SV head: sv_any, sv_refcnt (u32), sv_flags (u32), sv_u.
	svAny   = 0
	svFlags = 12
	svU     = 16
	svHead  = 24
	// sv_flags: the type, and SVf_OOK (a hash with its aux part).
	svTypeMask = 0xff
	svtPVGV    = 9
	svtPVHV    = 12
	svtPVCV    = 13
	svfOOK     = 0x02000000
	// xcv_flags: CVf_NAMED (xcv_gv_u is a HEK, not a GV).
	cvfNamed = 0x8000
	// struct hek: hek_len (I32), hek_key.
	hekLen = 4
	hekKey = 8
	// Context types (cx_type & 0xf) and flags.
	cxtEval    = 11
	cxTypeMask = 0x0f
	// PERLSI_MAIN.
	siMain = 1
)

// common is what every supported version shares.
var common = Layout{
	SICxstack: 8, SIPrev: 16, SICxix: 32, SICxmax: 36, SIType: 44,
	CXSize: 104, CXType: 0, CXOldcop: 16, CXRetop: 48, CXCV: 72,
	COPLine: 36, COPFile: 48,
	CVStash: 32, CVGv: 56, CVFlags: 92,
	GVNameHEK: 32, GVStash: 40, GPEgv: 56,
	HvMax: 24, AuxName: 0, AuxNameCount: 28,
}

// layouts by architecture (GOARCH) and minor version (5.minor).
var layouts = map[string]map[int]*Layout{"amd64": {}, "arm64": {}}

func init() {
	for minor, l := range map[int]struct {
		curcop, curstackinfo, auxBody uint64
		size                          map[string]uint64
	}{
		// 5.34 moved sub_generation, dowarn and utf8cache up (§3); 5.36
		// put HvAUX into the body (hv.h).
		32: {0xe0, 0xf0, 0, map[string]uint64{"amd64": 3792, "arm64": 3888}},
		34: {0xd0, 0xe0, 0, nil},
		36: {0xd0, 0xe0, 32, map[string]uint64{"amd64": 3768, "arm64": 3864}},
		38: {0xd0, 0xe0, 32, nil},
		40: {0xd0, 0xe0, 32, map[string]uint64{"amd64": 3768, "arm64": 3864}},
		// 5.42 moved nothing the unwinder reads: intrpvar.h@v5.42.3 drops
		// Xpv and adds env_mutex_depth after curstackinfo, and the size
		// stays (§12).
		42: {0xd0, 0xe0, 32, map[string]uint64{"amd64": 3768, "arm64": 3864}},
	} {
		for arch, byMinor := range layouts {
			lt := common
			lt.InterpCurcop, lt.InterpCurstackinfo, lt.InterpSize, lt.HvAuxBody = l.curcop, l.curstackinfo, l.size[arch], l.auxBody
			byMinor[minor] = &lt
		}
	}
}

// LayoutFor returns the layout of a version on this machine's
// architecture, or an error for one without.
func LayoutFor(v interpreter.Version) (*Layout, error) { return layoutFor(runtime.GOARCH, v) }

func layoutFor(arch string, v interpreter.Version) (*Layout, error) {
	byMinor, ok := layouts[arch]
	if !ok {
		return nil, fmt.Errorf("perl %v: no struct layout for %s (x86_64 and arm64 have one)", v, arch)
	}
	if l, ok := byMinor[v.Minor]; ok && v.Major == 5 {
		return l, nil
	}
	return nil, fmt.Errorf("perl %v: no struct layout (%s have one)", v, knownVersions(byMinor))
}

// knownVersions lists the versions a table has a layout for: "5.32, …,
// 5.42".
func knownVersions(byMinor map[int]*Layout) string {
	minors := slices.Sorted(maps.Keys(byMinor))
	names := make([]string, len(minors))
	for i, m := range minors {
		names[i] = fmt.Sprintf("5.%d", m)
	}
	return strings.Join(names, ", ")
}
