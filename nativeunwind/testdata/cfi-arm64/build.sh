#!/bin/sh
# Rebuilds fixture.so, the arm64 CFI fixture of nativeunwind's tests, on
# Debian 12 with gcc-aarch64-linux-gnu (GCC 12.2, binutils 2.40) installed.
set -eu
cd "$(dirname "$0")"
CC=aarch64-linux-gnu-gcc
$CC -O2 -fPIC -mbranch-protection=pac-ret+b-key -fasynchronous-unwind-tables -c fixture.c -o fixture.o
$CC -O2 -fPIC -g -fno-asynchronous-unwind-tables -fno-unwind-tables -c debugframe.c -o debugframe.o
$CC -c entry.S -o entry.o
$CC -shared -nostdlib -Wl,-z,max-page-size=4096 -Wl,-z,separate-code -o fixture.so fixture.o debugframe.o entry.o
# Keep .debug_frame and the symbol table, drop the rest of the DWARF.
aarch64-linux-gnu-objcopy \
	$(aarch64-linux-gnu-readelf -SW fixture.so | sed -n 's/.*\] \(\.debug_[a-z_]*\).*/\1/p' | grep -v '^\.debug_frame$' | sed 's/^/--remove-section=/') \
	fixture.so
rm -f fixture.o debugframe.o entry.o
