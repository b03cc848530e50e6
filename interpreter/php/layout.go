package php

import (
	"fmt"

	"github.com/hostprof/ebpf-profiler/interpreter"
)

// Layout is where a PHP release keeps what the unwinder and symbolizer
// read, in bytes (x86_64). internals.md §3 has the table and its sources;
// fields alike in every release are constants below.
type Layout struct {
	// zend_executor_globals.current_execute_data.
	CurrentExecuteData uint64
	// zend_op_array: last (the number of oplines), opcodes, filename,
	// line_start.
	OpArrayLast, OpArrayOpcodes, OpArrayFilename, OpArrayLineStart uint64
}

// Fields in the same place in 8.0-8.4 (internals.md §3).
const (
	// zend_function: type (u8), function_name, scope (common part).
	functionType  = 0
	functionName  = 8
	functionScope = 16
	// zend_class_entry.name.
	className = 8
	// zend_string: len, then the characters.
	stringLen = 16
	stringVal = 24
	// zend_op: its size and lineno (u32).
	opSize   = 32
	opLineno = 24
)

// zend_function.type values (Zend/zend_compile.h).
const (
	internalFunction = 1
	userFunction     = 2
	evalCode         = 4
)

// layouts by minor release of PHP 8 (patch releases keep the ABI).
var layouts = map[int]Layout{
	0: {CurrentExecuteData: 488, OpArrayLast: 68, OpArrayOpcodes: 72, OpArrayFilename: 144, OpArrayLineStart: 152},
	1: {CurrentExecuteData: 488, OpArrayLast: 68, OpArrayOpcodes: 72, OpArrayFilename: 144, OpArrayLineStart: 152},
	2: {CurrentExecuteData: 488, OpArrayLast: 80, OpArrayOpcodes: 88, OpArrayFilename: 152, OpArrayLineStart: 160},
	3: {CurrentExecuteData: 488, OpArrayLast: 76, OpArrayOpcodes: 80, OpArrayFilename: 144, OpArrayLineStart: 152},
	4: {CurrentExecuteData: 488, OpArrayLast: 96, OpArrayOpcodes: 104, OpArrayFilename: 168, OpArrayLineStart: 176},
}

// LayoutFor returns the layout of a release.
func LayoutFor(v interpreter.Version) (*Layout, error) {
	if l, ok := layouts[v.Minor]; ok && v.Major == 8 {
		return &l, nil
	}
	return nil, fmt.Errorf("PHP %v: no struct offsets known (8.0 to 8.4 are)", v)
}

// functionHead is how much of a zend_function the symbolizer reads: up to
// the last op_array field it uses in any layout.
func (l *Layout) functionHead() uint64 {
	return max(l.OpArrayLast+4, l.OpArrayOpcodes+8, l.OpArrayFilename+8, l.OpArrayLineStart+4)
}
