package ruby

import (
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Layout is where a CRuby version keeps what the unwinder and the
// symbolizer read: byte offsets into its structs and the values of its
// flags, x86_64. Sources: internals.md, whose sections name the headers
// (vm_core.h, iseq.h, method.h, symbol.c, rstring.h, rarray.h) of Debian's
// 3.1.2, 3.3.8 and 3.4.5 sources each value was measured against; all of
// them are checked against running interpreters by TestSymbolize.
type Layout struct {
	// rb_control_frame_t: its size, and pc, iseq, ep (§3).
	CFPSize, CFPPC, CFPISeq, CFPEP uint64
	// rb_execution_context_t: vm_stack, vm_stack_size (in words), cfp (§2).
	ECVMStack, ECVMStackSize, ECCFP uint64

	// rb_iseq_t.body, and rb_iseq_constant_body's iseq_encoded (after
	// iseq_size, a u32),
	// location.pathobj and .label, first_lineno and insns_info (§5).
	ISeqBody, BodyEncoded, BodyPathObj, BodyLabel, BodyFirstLine, BodyInsnsInfo uint64
	// FirstLineFixnum: first_lineno is a Fixnum VALUE (3.0, 3.1), not an
	// int.
	FirstLineFixnum bool
	// InsnInfoSize is sizeof(struct iseq_insn_info_entry), whose line_no
	// is its first int.
	InsnInfoSize uint64

	// RString: the heap form's length and pointer, the embedded form's
	// bytes, and, before 3.2, its length in the flags (§6).
	StrLen, StrPtr, StrEmbedded uint64
	StrEmbedLenInFlags          bool
	// RArray: the heap form's length and pointer, the embedded elements,
	// and the mask of the embedded length in the flags (shift 15).
	AryLen, AryPtr, AryEmbedded, AryEmbedLenMask uint64
	// Qnil's value.
	Nil uint64

	// rb_method_entry_t's def and owner, rb_method_definition_t's
	// original_id (§4).
	MEDef, MEOwner, DefOriginalID uint64
	// ClassPath is the offset of a class's classpath (3.3+, §7).
	ClassPath uint64
	// SingletonFlag marks a singleton class (RUBY_FL_SINGLETON), whose
	// attached object is at SingletonAttached (3.3+).
	SingletonFlag, SingletonAttached uint64
	// ClassExt, before 3.3, is RClass's pointer to its rb_classext_t,
	// whose iv_tbl at ExtIvTbl holds the class's path and a singleton
	// class's attached object as hidden instance variables (§7).
	ClassExt, ExtIvTbl uint64
	// LastOpID is tLAST_OP_ID: IDs above it are serial<<4|scope (§7).
	LastOpID uint64
}

// Values every CRuby 3.x shares (internals.md §4, §6, §7).
const (
	// The environment slot of a frame's method entry, relative to ep in
	// words (VM_ENV_DATA_INDEX_ME_CREF).
	epMECref = -2
	// Frame magic (ep[0] & frameMagicMask) and flags.
	frameMagicMask   = 0x7fff0001
	frameMagicMethod = 0x11110001
	frameMagicDummy  = 0x79990001
	frameFlagCFrame  = 0x80

	strNoEmbed  = 0x2000 // RSTRING_NOEMBED (FL_USER1)
	aryEmbedded = 0x2000 // RARRAY_EMBED_FLAG (FL_USER1)
	typeMask    = 0x1f
	typeString  = 0x05
	typeArray   = 0x07
	typeIMemo   = 0x1a
	// T_MOVED: a slot compaction moved its object out of, which it keeps
	// at RMoved.destination (gc.c) until the next collection.
	typeMoved        = 0x1e
	movedDestination = 16
	imemoShift       = 12
	imemoMask        = 0xf
	imemoMEnt        = 6
	imemoISeq        = 7
	// rb_method_definition_t: the method type in the low bits of its
	// first word, its body at 8 (§4).
	defTypeMask     = 0xf
	defBody         = 8
	methodTypeISeq  = 0
	methodTypeCFunc = 1
	idScopeShift    = 4
	// The symbol table: last_id (u32), ids (an Array of Arrays of
	// ID_ENTRY_UNIT entries of ID_ENTRY_SIZE: String, Symbol).
	symbolsIDs  = 16
	idEntryUnit = 512
	idEntrySize = 2
)

// layouts by major.minor. 3.0 and 3.2, which no Debian suite carries and
// which are not tested, are not offered.
var layouts = map[[2]int]*Layout{
	{3, 1}: {
		CFPSize: 64, CFPPC: 0, CFPISeq: 16, CFPEP: 32,
		ECVMStack: 0, ECVMStackSize: 8, ECCFP: 16,
		ISeqBody: 16, BodyEncoded: 8, BodyPathObj: 64, BodyLabel: 80, BodyFirstLine: 88, BodyInsnsInfo: 120,
		FirstLineFixnum: true, InsnInfoSize: 12,
		StrLen: 16, StrPtr: 24, StrEmbedded: 16, StrEmbedLenInFlags: true,
		AryLen: 16, AryPtr: 32, AryEmbedded: 16, AryEmbedLenMask: 0x18000,
		Nil:   8,
		MEDef: 16, MEOwner: 32, DefOriginalID: 32,
		SingletonFlag: 0x1000, ClassExt: 24, ExtIvTbl: 8, LastOpID: 169,
	},
	{3, 3}: {
		CFPSize: 56, CFPPC: 0, CFPISeq: 16, CFPEP: 32,
		ECVMStack: 0, ECVMStackSize: 8, ECCFP: 16,
		ISeqBody: 16, BodyEncoded: 8, BodyPathObj: 64, BodyLabel: 80, BodyFirstLine: 88, BodyInsnsInfo: 112,
		InsnInfoSize: 12,
		StrLen:       16, StrPtr: 24, StrEmbedded: 24,
		AryLen: 16, AryPtr: 32, AryEmbedded: 16, AryEmbedLenMask: 0x3f8000,
		Nil:   4,
		MEDef: 16, MEOwner: 32, DefOriginalID: 32,
		ClassPath: 152, SingletonFlag: 0x1000, SingletonAttached: 128, LastOpID: 169,
	},
}

func init() {
	// 3.4 moved RUBY_FL_SINGLETON and added an operator ID; the rest of
	// what is read here is as in 3.3.
	l := *layouts[[2]int{3, 3}]
	l.SingletonFlag, l.LastOpID = 0x2000, 170
	layouts[[2]int{3, 4}] = &l
}

// LayoutFor returns the layout of a version, or an error for one without.
func LayoutFor(v interpreter.Version) (*Layout, error) {
	if l, ok := layouts[[2]int{v.Major, v.Minor}]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("CRuby %v: no struct layout for %s (3.1, 3.3 and 3.4 have one)", v, v.MajorMinor())
}
