#!/bin/bash
# fetch-luajit.sh VERSION [ARCH] - a Debian LuaJIT build (OpenResty's 2.1 branch) for the profiler's
# LuaJIT tests: 2.1-20250117 (trixie's 2.1.0+openresty20250117) or 2.1-20251030 (sid's
# 2.1.0+openresty20251030), for this machine or a foreign ARCH (arm64: unpacked here, never run;
# detection is tested on it and the kernel matrix's arm64 VMs run it).
#
# Downloads luajit (the executable, with the VM linked in: it does not load the library),
# libluajit-5.1-2 (libluajit-5.1.so.2, the same VM for programs that embed it), libluajit-5.1-common (the jit.* Lua modules, -jdump and
# -jv among them) and libluajit-5.1-dev (lua.h, luajit.h, ...) from the suite with the libraries
# they link against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/luajit-VERSION-ARCH/root/
# Both suites' C libraries are newer than Debian 12's glibc 2.36, and a foreign architecture's build
# needs its own: the suite's libc6 is unpacked too and the executable is pointed at that loader and
# the unpacked libraries with patchelf (PT_INTERP and DT_RPATH), so the process is the genuine luajit
# mapping the genuine libluajit-5.1.so.2. bin/luajit is a wrapper that sets LUA_PATH to the unpacked
# jit.* modules and execs it. bin/luajit-embed is a small C host (host/embed.c beside this script,
# compiled with the host's gcc, or aarch64-linux-gnu-gcc for arm64, against the unpacked headers)
# linked against the unpacked libluajit-5.1.so.2 and pointed at the unpacked root the same way: it
# runs a Lua script file through luaL_loadfile and lua_pcall, the embedded case.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# wrapper's path.
set -euo pipefail

die() { echo "fetch-luajit: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 2.1-20250117|2.1-20251030 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
case $V in
  2.1-20250117) SUITE=trixie ;;
  2.1-20251030) SUITE=sid ;;
  *) die "no Debian suite known for LuaJIT $V" ;;
esac
# Debian's upstream version of the build, e.g. 2.1.0+openresty20250117: a suite that moved on to
# another snapshot is refused, not unpacked under the old name.
UPSTREAM=2.1.0+openresty${V#2.1-}
FOREIGN=0
[ "$RUNTIME_ARCH" = "$HOST" ] || FOREIGN=1
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../debfetch/runtime-debs.sh"
OUT=$BASE/luajit-$V-$RUNTIME_ARCH
ROOT=$OUT/root WRAPPER=$OUT/bin/luajit EMBED=$OUT/bin/luajit-embed
LIBDIR=$ROOT/usr/lib/$(runtime_triplet) INC=$ROOT/usr/include/luajit-2.1
LUAPATH="$ROOT/usr/share/luajit-2.1/?.lua;;"
# The checks: the interpreter alone (-joff), with the JIT compiling a hot loop, and the C host
# running a script file; each prints a known line.
script='local s = 0 for i = 1, 1e6 do s = s + i % 7 end print(s)'
want=2999998
runs() {
  [ "$FOREIGN" = 1 ] && return 0
  local f
  f=$(mktemp --suffix=.lua) && echo "$script" >"$f" || return 1
  [ "$("$WRAPPER" -joff -e "$script")" = $want ] && [ "$("$WRAPPER" -jon -e "$script")" = $want ] &&
    [ "$("$WRAPPER" -jv=/dev/null -e "$script")" = $want ] && [ "$("$EMBED" "$f")" = $want ]
  local rc=$?
  rm -f "$f"
  return $rc
}
if [ -f "$OUT/.complete" ] && [ -x "$EMBED" ] && runs 2>/dev/null; then echo "$WRAPPER"; exit 0; fi

unpack_runtime "$OUT" "$SUITE" 0 1 luajit libluajit-5.1-2 libluajit-5.1-common libluajit-5.1-dev ||
  die "unpacking LuaJIT $V failed"
got=$(dpkg-deb -f "$(ls "$OUT"/debs/libluajit-5.1-2_*.deb | sort -V | tail -1)" Version)
case $got in
  "$UPSTREAM"-*) ;;
  *) die "Debian $SUITE now has libluajit-5.1-2 $got, not $UPSTREAM: add it as a new version" ;;
esac
EXE=$(readlink -f "$ROOT/usr/bin/luajit" 2>/dev/null || true)
case $EXE in "$ROOT"/*) ;; *) die "usr/bin/luajit missing or outside the root after unpacking" ;; esac
[ -x "$EXE" ] || die "$EXE is not executable"
[ -f "$LIBDIR/libluajit-5.1.so.2" ] || die "$LIBDIR/libluajit-5.1.so.2 missing after unpacking"
[ -f "$INC/luajit.h" ] || die "$INC/luajit.h missing after unpacking (libluajit-5.1-dev)"
point_at_root "$EXE" "$ROOT" 1 || die "patchelf $EXE failed"

mkdir -p "$OUT/bin"
cat >"$WRAPPER" <<W
#!/bin/sh
# LuaJIT $V from Debian $SUITE with its own jit.* modules and libraries (written by fetch-luajit.sh).
LUA_PATH='$LUAPATH' exec '$EXE' "\$@"
W
chmod +x "$WRAPPER"

# The C host: compiled against the unpacked headers and linked against the unpacked library; the
# suite's libc symbols the library needs are resolved at run time by the suite's loader, so the
# link does not check them against the compiler's (older, or foreign) C library.
case $RUNTIME_ARCH in
  "$HOST") CC=gcc ;;
  arm64) CC=aarch64-linux-gnu-gcc ;;
  *) die "no C compiler known for $RUNTIME_ARCH" ;;
esac
command -v "$CC" >/dev/null || die "$CC missing (install-test-deps.sh installs it)"
"$CC" -O1 -g -fno-omit-frame-pointer -I"$INC" -o "$EMBED" "$HERE/host/embed.c" "$LIBDIR/libluajit-5.1.so.2" \
  -Wl,--allow-shlib-undefined || die "compiling the C host failed"
point_at_root "$EMBED" "$ROOT" 1 || die "patchelf $EMBED failed"

if [ "$FOREIGN" = 0 ]; then
  runs || die "$WRAPPER (with -joff, -jon, -jv) or $EMBED does not print $want"
  "$WRAPPER" -v >&2
fi
echo "$got" >"$OUT/.complete"
echo "$WRAPPER"
