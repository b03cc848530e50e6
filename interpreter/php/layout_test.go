package php

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/hostprof/ebpf-profiler/utils/phpfetch"
)

// offsetsProgram prints, with the engine's own headers, every offset and
// size the unwinder and symbolizer use, one "name value" per line.
const offsetsProgram = `#include <stddef.h>
#include <stdio.h>
#include "php.h"
#include "zend_globals.h"
#define P(name, v) printf("%s %zu\n", name, (size_t)(v))
int main(void) {
  P("CurrentExecuteData", offsetof(zend_executor_globals, current_execute_data));
  P("OpArrayLast", offsetof(zend_op_array, last));
  P("OpArrayOpcodes", offsetof(zend_op_array, opcodes));
  P("OpArrayFilename", offsetof(zend_op_array, filename));
  P("OpArrayLineStart", offsetof(zend_op_array, line_start));
  P("executeDataOpline", offsetof(zend_execute_data, opline));
  P("executeDataFunc", offsetof(zend_execute_data, func));
  P("executeDataThisTypeInfo", offsetof(zend_execute_data, This.u1.type_info));
  P("executeDataPrev", offsetof(zend_execute_data, prev_execute_data));
  P("functionType", offsetof(zend_function, type));
  P("functionName", offsetof(zend_function, common.function_name));
  P("functionScope", offsetof(zend_function, common.scope));
  P("opArrayType", offsetof(zend_function, op_array.type));
  P("className", offsetof(zend_class_entry, name));
  P("stringLen", offsetof(zend_string, len));
  P("stringVal", offsetof(zend_string, val));
  P("opSize", sizeof(zend_op));
  P("opLineno", offsetof(zend_op, lineno));
  P("ZEND_CALL_TOP", ZEND_CALL_TOP);
  P("ZEND_INTERNAL_FUNCTION", ZEND_INTERNAL_FUNCTION);
  P("ZEND_EVAL_CODE", ZEND_EVAL_CODE);
  return 0;
}
`

// TestLayoutFromHeaders compiles offsetsProgram against the headers of
// every tested release (Debian's php8.X-dev) and checks the offset table
// and the constants against what it prints.
func TestLayoutFromHeaders(t *testing.T) {
	for _, v := range phpfetch.Versions {
		t.Run(v, func(t *testing.T) {
			b, err := phpfetch.PHP(v)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			src, bin := filepath.Join(dir, "offsets.c"), filepath.Join(dir, "offsets")
			if err := os.WriteFile(src, []byte(offsetsProgram), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"-o", bin, src}
			for _, sub := range []string{"", "main", "Zend", "TSRM"} {
				args = append(args, "-I", filepath.Join(b.Headers, sub))
			}
			if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
				t.Fatalf("gcc: %v\n%s", err, out)
			}
			out, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint64{}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				var name string
				var val uint64
				if _, err := fmt.Sscanf(line, "%s %d", &name, &val); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				got[name] = val
			}
			var minor int
			fmt.Sscanf(v, "8.%d", &minor)
			l := layouts[minor]
			want := map[string]uint64{
				"CurrentExecuteData": l.CurrentExecuteData, "OpArrayLast": l.OpArrayLast, "OpArrayOpcodes": l.OpArrayOpcodes,
				"OpArrayFilename": l.OpArrayFilename, "OpArrayLineStart": l.OpArrayLineStart,
				"executeDataOpline": executeDataOpline, "executeDataFunc": executeDataFunc, "executeDataThisTypeInfo": uint64(unsafe.Offsetof(unwinderExecuteData{}.ThisTypeInfo)),
				"executeDataPrev": executeDataPrev, "functionType": functionType, "functionName": functionName,
				"functionScope": functionScope, "opArrayType": functionType, "className": className,
				"stringLen": stringLen, "stringVal": stringVal, "opSize": opSize, "opLineno": opLineno,
				"ZEND_CALL_TOP": 1 << 17, "ZEND_INTERNAL_FUNCTION": internalFunction, "ZEND_EVAL_CODE": evalCode,
			}
			for name, w := range want {
				if g, ok := got[name]; !ok || g != w {
					t.Errorf("%s: headers say %d (printed: %v), the table %d", name, g, ok, w)
				}
			}
		})
	}
}
