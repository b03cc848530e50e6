package v8

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrLayout says a V8 build's layout is not known well enough to unwind.
var ErrLayout = errors.New("V8 layout unknown")

// Layout is where a V8 build keeps what the unwinder and the symbolizer
// read: from its metadata, completed from versionTable. Offsets are from
// an object's untagged start (tagged pointer - 1); frame slots from the
// frame pointer.
type Layout struct {
	Version [3]int

	// Frame slots of JavaScript frames and the typed frames' marker.
	FPContext, FPFunction, FPBytecodeArray, FPBytecodeOffset int64
	// Frame types (StackFrame::Type) of typed frames.
	FrameEntry, FrameConstructEntry, FrameExit, FrameBuiltinExit int64
	// FrameTypes is one above the highest frame type.
	FrameTypes int64

	// Instance types.
	TypeSFI, TypeScript, TypeScopeInfo, TypeBytecodeArray, TypeCode, TypeIStream uint16
	TypeInterpreterData                                                          uint16
	FirstNonstringType                                                           uint16

	MapInstanceType int64

	JSFunctionShared int64

	SFIFunctionData, SFINameOrScopeInfo, SFIScript int64

	ScriptSource, ScriptName, ScriptLineEnds, ScriptLineOffset, ScriptColumnOffset int64

	// ScopeInfo: the flags (a Smi, or a raw uint32 where ScopeInfoRawFlags)
	// and the word index of the first variable-length slot.
	ScopeInfoFlags, ScopeInfoContextLocals, ScopeInfoFirstVar int64
	ScopeInfoRawFlags                                         bool

	// Code: where InlineCode, the instructions follow the Code object's
	// header at CodeInstructionStart; otherwise CodeInstructionStart
	// holds their address and an InstructionStream of IStreamHeader bytes
	// precedes them.
	InlineCode                                    bool
	CodeInstructionStart, CodeInstructionSize     int64
	CodeFlags, CodeDeoptData, CodePositionTable   int64
	CodeKindMask, CodeKindShift                   uint32
	KindInterpreted, KindBaseline                 uint32
	IStreamHeader, IStreamCode                    int64
	DeoptInlinedCount, DeoptLiterals, DeoptSFI    int64
	DeoptInliningPositions                        int64
	DeoptSFIWrapped                               bool
	SFIWrapperSFI                                 int64
	BytecodeArrayPositionTable, BytecodeArrayData int64
	InterpreterDataBytecode                       int64
	// PositionFormat is how position tables write code offsets.
	PositionFormat positionFormat

	FixedArrayLength, FixedArrayData int64

	// Strings.
	StringLength, SeqOneByteChars, SeqTwoByteChars  int64
	ConsFirst, ConsSecond, SlicedParent, SlicedOffs int64
	ThinActual, ExternalResourceData                int64
	ReprMask, EncodingMask                          uint16
	SeqTag, ConsTag, ExternalTag, SlicedTag         uint16
	ThinTag, OneByteTag                             uint16
}

// MaglevKind and TurbofanKind are the optimized code kinds: CodeKind lists
// BASELINE, MAGLEV, TURBOFAN in a row in every version (internals.md §2.2).
func (l *Layout) MaglevKind() uint32   { return l.KindBaseline + 1 }
func (l *Layout) TurbofanKind() uint32 { return l.KindBaseline + 2 }

// versionTable completes the metadata of the V8 versions Node 18-26 ship
// (major, minor): the values a build does not export, by the name the
// layout resolver asks for. The sources of each are in internals.md: [V]
// is V8 V's source, [NX] a disassembly of Node X's binary.
var versionTable = map[[2]int]map[string]int64{
	// Node 18.
	{10, 2}: {
		"Code.deoptimization_data":     16, // [N18] dis Code::Inlines
		"Code.source_position_table":   24, // [10.2] src/objects/code.h:611-637
		"BytecodeArray.position_table": 32, // [10.2] src/objects/code.tq:15-28
		"InterpreterData.bytecode":     8,  // [10.2] src/objects/shared-function-info.tq
		"DeoptInlinedCount":            1,  // [10.2] code.h:1115-1126
		"DeoptLiterals":                2,
		"DeoptSFI":                     6,
		"DeoptInliningPositions":       7,
	},
	// Node 20.
	{11, 3}: {
		"Code.instruction_start":       40, // [N20] dis Code::FlushICache
		"Code.flags":                   48, // [N20] dis AbstractCode::SourcePosition
		"Code.instruction_size":        56, // [N20] dis Code::FlushICache
		"InstructionStream.code":       8,  // [11.5] src/objects/instruction-stream.h
		"BytecodeArray.position_table": 32, // [N20] dis AbstractCode::SourcePosition
		"BytecodeArray.length":         8,
		"InterpreterData.bytecode":     8,
	},
	// Node 22.
	{12, 4}: {
		"SharedFunctionInfo.function_data": 8,  // [N22] name at 16, data before it
		"Code.deoptimization_data":         8,  // [N22] dis Code::Inlines
		"Code.source_position_table":       16, // [N22] dis AbstractCode::SourcePosition
		"InstructionStream.code":           8,
		"BytecodeArray.position_table":     24, // [N22] dis BytecodeArray::SourcePositionTable
		"InterpreterData.bytecode":         8,
	},
	// Node 24.
	{13, 6}: {
		"SharedFunctionInfo.function_data": 8,  // [N24] dis SharedFunctionInfo::GetBytecodeArray
		"Code.deoptimization_data":         8,  // [N24] dis Code::Inlines
		"Code.source_position_table":       16, // [N24] dis Code::SourcePosition
		"InstructionStream.code":           8,  // [15.0] src/objects/instruction-stream.h:130-150
		"BytecodeArray.position_table":     24, // [N24] dis BytecodeArray::SourcePosition
		"InterpreterData.bytecode":         8,
		"SharedFunctionInfoWrapper.sfi":    8,
	},
	// Node 25: the fills of 13.6, each read again from this build.
	{14, 1}: {
		"SharedFunctionInfo.function_data": 8,  // [N25] dis SharedFunctionInfo::GetBytecodeArray<Isolate>
		"Code.deoptimization_data":         8,  // [N25] dis Code::Inlines
		"Code.source_position_table":       16, // [N25] dis Code::SourcePosition
		"InstructionStream.code":           8,  // [N25] dis InstructionStream::InstructionStreamPrint
		"BytecodeArray.position_table":     24, // [N25] dis BytecodeArray::SourcePosition
		"InterpreterData.bytecode":         8,  // [N25] dis SharedFunctionInfo::GetBytecodeArray<Isolate>
		"SharedFunctionInfoWrapper.sfi":    8,
	},
	// Node 26: the same again.
	{14, 6}: {
		"SharedFunctionInfo.function_data": 8,  // [N26] dis SharedFunctionInfo::GetActiveBytecodeArray
		"Code.deoptimization_data":         8,  // [N26] dis Code::Inlines
		"Code.source_position_table":       16, // [N26] dis Code::SourcePosition
		"InstructionStream.code":           8,  // [N26] dis InstructionStream::InstructionStreamPrint
		"BytecodeArray.position_table":     24, // [N26] dis BytecodeArray::SourcePosition
		"InterpreterData.bytecode":         8,  // [N26] dis SharedFunctionInfo::GetActiveBytecodeArray
		"SharedFunctionInfoWrapper.sfi":    8,
	},
}

// layoutResolver reads a Layout's values and gathers what is missing.
type layoutResolver struct {
	md      Metadata
	fill    map[string]int64
	missing []string
}

// value is a metadata constant, or the version table's fill under key.
func (r *layoutResolver) value(name, key string) int64 {
	if v, ok := r.md[name]; ok {
		return v
	}
	if v, ok := r.fill[key]; ok {
		return v
	}
	r.missing = append(r.missing, name)
	return 0
}

// offset is Class's field (under any of its names), or the version
// table's Class.key.
func (r *layoutResolver) offset(class, key string, fields ...string) int64 {
	if v, ok := r.md.field(class, fields...); ok {
		return v
	}
	if v, ok := r.fill[class+"."+key]; ok {
		return v
	}
	r.missing = append(r.missing, class+"::"+fields[0])
	return 0
}

func (r *layoutResolver) typ(class string) uint16 {
	prefix := "type_" + class + "__"
	for name, v := range r.md {
		if strings.HasPrefix(name, prefix) {
			return uint16(v)
		}
	}
	r.missing = append(r.missing, "type "+class)
	return 0
}

// NewLayout builds the layout of a V8 version from its metadata.
func NewLayout(md Metadata, version [3]int) (*Layout, error) {
	fill, known := versionTable[[2]int{version[0], version[1]}]
	if !known {
		return nil, fmt.Errorf("%w: V8 %d.%d.%d is not one the unwinder knows (%s)", ErrLayout,
			version[0], version[1], version[2], knownVersions())
	}
	// Tagged values are 8 bytes and Smis the upper half of a word: no
	// pointer compression (internals.md §7).
	if md["TaggedSize"] != 8 || md["SmiShiftSize"] != 31 || md["HeapObjectTag"] != 1 || md["SmiTag"] != 0 {
		return nil, fmt.Errorf("%w: V8 %d.%d.%d built with pointer compression (tagged size %d, Smi shift %d)",
			ErrLayout, version[0], version[1], version[2], md["TaggedSize"], md["SmiShiftSize"])
	}
	r := &layoutResolver{md: md, fill: fill}
	l := &Layout{Version: version}

	l.FPContext = r.value("off_fp_context", "")
	l.FPFunction = r.value("off_fp_function", "")
	l.FPBytecodeArray = r.value("off_fp_bytecode_array", "")
	l.FPBytecodeOffset = r.value("off_fp_bytecode_offset", "")
	l.FrameEntry = r.value("frametype_EntryFrame", "")
	l.FrameConstructEntry = r.value("frametype_ConstructEntryFrame", "")
	l.FrameExit = r.value("frametype_ExitFrame", "")
	l.FrameBuiltinExit = r.value("frametype_BuiltinExitFrame", "")
	for name, v := range md {
		if strings.HasPrefix(name, "frametype_") && v >= l.FrameTypes {
			l.FrameTypes = v + 1
		}
	}

	l.TypeSFI = r.typ("SharedFunctionInfo")
	l.TypeScript = r.typ("Script")
	l.TypeScopeInfo = r.typ("ScopeInfo")
	l.TypeBytecodeArray = r.typ("BytecodeArray")
	l.TypeCode = r.typ("Code")
	l.TypeInterpreterData = r.typ("InterpreterData")
	l.FirstNonstringType = uint16(r.value("FirstNonstringType", ""))

	l.MapInstanceType = r.offset("Map", "", "instance_type")
	l.JSFunctionShared = r.offset("JSFunction", "", "shared")
	l.SFIFunctionData = r.offset("SharedFunctionInfo", "function_data", "function_data", "trusted_function_data")
	l.SFINameOrScopeInfo = r.offset("SharedFunctionInfo", "", "name_or_scope_info")
	l.SFIScript = r.offset("SharedFunctionInfo", "", "script", "script_or_debug_info")

	l.ScriptSource = r.offset("Script", "", "source")
	l.ScriptName = r.offset("Script", "", "name")
	l.ScriptLineEnds = r.offset("Script", "", "line_ends")
	// The Smis after name, in the order of every version's script.tq
	// (source, name, line_offset, column_offset): not exported.
	l.ScriptLineOffset = l.ScriptName + 8
	l.ScriptColumnOffset = l.ScriptName + 16

	// ScopeInfo's flags are a Smi before V8 13 and a raw uint32 since
	// ([N24] dis ScopeInfo::HasFunctionName).
	l.ScopeInfoFlags = 8
	l.ScopeInfoRawFlags = version[0] >= 13
	l.ScopeInfoContextLocals = 8 + 8*r.value("scopeinfo_idx_ncontextlocals", "")
	l.ScopeInfoFirstVar = r.value("scopeinfo_idx_first_vars", "")

	l.CodeKindMask = uint32(r.value("CodeKindFieldMask", ""))
	l.CodeKindShift = uint32(r.value("CodeKindFieldShift", ""))
	l.KindInterpreted = uint32(r.value("CodeKindInterpretedFunction", ""))
	l.KindBaseline = uint32(r.value("CodeKindBaseline", ""))
	l.CodeFlags = r.offset("Code", "flags", "flags")
	l.CodeInstructionSize = r.offset("Code", "instruction_size", "instruction_size")
	l.CodeDeoptData = r.offset("Code", "deoptimization_data", "deoptimization_data")
	l.CodePositionTable = r.offset("Code", "source_position_table", "source_position_table")
	if l.InlineCode = version[0] < 11; l.InlineCode {
		// V8 10: one Code object, the instructions at its end.
		l.CodeInstructionStart = r.offset("Code", "", "instruction_start")
	} else {
		l.TypeIStream = r.typ("InstructionStream")
		l.CodeInstructionStart = r.offset("Code", "instruction_start", "instruction_start")
		l.IStreamHeader = r.offset("InstructionStream", "", "instruction_start")
		l.IStreamCode = r.offset("InstructionStream", "code", "code")
	}

	if l.DeoptSFIWrapped = md.has("DeoptimizationDataWrappedSharedFunctionInfoIndex"); l.DeoptSFIWrapped {
		l.DeoptSFI = md["DeoptimizationDataWrappedSharedFunctionInfoIndex"]
		l.SFIWrapperSFI = r.offset("SharedFunctionInfoWrapper", "sfi", "shared_info")
	} else {
		l.DeoptSFI = r.value("DeoptimizationDataSharedFunctionInfoIndex", "DeoptSFI")
	}
	l.DeoptInlinedCount = r.value("DeoptimizationDataInlinedFunctionCountIndex", "DeoptInlinedCount")
	l.DeoptLiterals = r.value("DeoptimizationDataLiteralArrayIndex", "DeoptLiterals")
	l.DeoptInliningPositions = r.value("DeoptimizationDataInliningPositionsIndex", "DeoptInliningPositions")
	l.BytecodeArrayPositionTable = r.offset("BytecodeArray", "position_table", "source_position_table")
	l.BytecodeArrayData = r.offset("BytecodeArray", "", "data")
	l.InterpreterDataBytecode = r.offset("InterpreterData", "bytecode", "bytecode_array")
	// Not in the metadata: V8 14 writes position tables' code offsets
	// unsigned with two flag bits (positions.go).
	if version[0] >= 14 {
		l.PositionFormat = positionsFlagged
	}

	l.FixedArrayLength = r.offset("FixedArrayBase", "", "length")
	l.FixedArrayData = r.offset("FixedArray", "", "data")

	l.StringLength = r.offset("String", "", "length")
	l.SeqOneByteChars = r.offset("SeqOneByteString", "", "chars")
	l.SeqTwoByteChars = r.offset("SeqTwoByteString", "", "chars")
	l.ConsFirst = r.offset("ConsString", "", "first")
	l.ConsSecond = r.offset("ConsString", "", "second")
	l.SlicedParent = r.offset("SlicedString", "", "parent")
	l.SlicedOffs = r.offset("SlicedString", "", "offset")
	l.ThinActual = r.offset("ThinString", "", "actual")
	// An external string's cached data pointer follows its resource
	// pointer ([15.0] src/objects/string.tq:85-89, the same in 10.2).
	l.ExternalResourceData = r.offset("ExternalString", "", "resource") + 8
	l.ReprMask = uint16(r.value("StringRepresentationMask", ""))
	l.EncodingMask = uint16(r.value("StringEncodingMask", ""))
	l.SeqTag = uint16(r.value("SeqStringTag", ""))
	l.ConsTag = uint16(r.value("ConsStringTag", ""))
	l.ExternalTag = uint16(r.value("ExternalStringTag", ""))
	l.SlicedTag = uint16(r.value("SlicedStringTag", ""))
	l.ThinTag = uint16(r.value("ThinStringTag", ""))
	l.OneByteTag = uint16(r.value("OneByteStringTag", ""))

	if len(r.missing) > 0 {
		return nil, fmt.Errorf("%w: V8 %d.%d.%d lacks %s", ErrLayout, version[0], version[1], version[2],
			strings.Join(r.missing, ", "))
	}
	return l, nil
}

// knownVersions lists versionTable's versions.
func knownVersions() string {
	var vs []string
	for v := range versionTable {
		vs = append(vs, fmt.Sprintf("%d.%d", v[0], v[1]))
	}
	sort.Strings(vs)
	return "known: " + strings.Join(vs, ", ")
}
