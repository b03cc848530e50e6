#!/bin/bash
# build-python-tailcall.sh VERSION - a CPython source build with the tail-calling interpreter (3.14+)
# for the profiler's Python tests.
#
# From 3.14, CPython can be configured --with-tail-call-interp: the eval loop is then one small
# function per instruction, each ending in a tail call of the next instruction's (clang 19+:
# __attribute__((musttail)) and preserve_none), entered from _PyEval_EvalFrameDefault. Debian
# builds it with gcc, without; python.org's macOS and Windows builds and some distributions' clang
# builds have it. This builds the newest upstream release of VERSION (its source from the Go
# module proxy, below) with Debian 12's clang-19 (installed with apt-get if missing), -O2 without
# PGO or LTO, statically linked into the python executable as Debian's, installed
# under
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/python-VERSION-tailcall-amd64/root/
# whose bin/python3 runs as is. About 4 minutes on 2 cores; idempotent: a finished cache dir is
# reused without network or rebuild. Last line of stdout: the python path.
set -euo pipefail

die() { echo "build-python-tailcall: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 3.14|3.15"
V=$1
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is built"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/python-$V-tailcall-amd64 ROOT=$BASE/python-$V-tailcall-amd64/root
PY=$ROOT/bin/python$V
tail_ok() { [ "$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("Py_TAIL_CALL_INTERP"))' 2>/dev/null)" = 1 ]; }
if [ -f "$OUT/.complete" ] && tail_ok; then echo "$PY"; exit 0; fi

# shellcheck source=../debfetch/private-apt.sh
. "$(dirname "$0")/../debfetch/private-apt.sh"
deps=(clang-19 make libc6-dev xz-utils zlib1g-dev libffi-dev)
install_missing "${deps[@]}" || die "missing build dependencies"

# The source: Debian's mirror here lacks python3.X's .orig tarballs, so the release is taken from
# the Go module proxy, which serves CPython's git tags as the module github.com/python/cpython
# (vX.Y.Z+incompatible), checked against the Go checksum database; the newest X.Y.Z it lists.
command -v go >/dev/null || die "go is needed to fetch the source from the module proxy"
export GOMODCACHE=$OUT/gomod GOFLAGS=-modcacherw
TAG=$(cd /tmp && go list -m -versions github.com/python/cpython | tr ' ' '\n' | grep -E "^v${V//./\\.}\.[0-9]+\+incompatible$" | sort -V | tail -1)
[ -n "$TAG" ] || die "the module proxy lists no CPython $V release"
SRC=$(cd /tmp && go mod download -json "github.com/python/cpython@$TAG" | awk -F'"' '/"Dir":/ {print $4}')
[ -f "$SRC/configure" ] || die "no CPython source for $TAG from the module proxy"
UPV=${TAG#v} UPV=${UPV%+incompatible}

rm -rf "$OUT/build" "$ROOT" "$OUT/.complete" && mkdir -p "$OUT/build"
cp -r "$SRC"/. "$OUT/build" && chmod -R u+w "$OUT/build"
# Module zips keep no file modes: the scripts (#! first) are made executable again.
find "$OUT/build" -type f -size -2M -print0 | while IFS= read -r -d '' f; do
  [ "$(head -c2 "$f" | tr -d '\0')" != '#!' ] || chmod +x "$f"
done
start=$(date +%s)
(
  cd "$OUT/build"
  CC=clang-19 ./configure -q --prefix="$ROOT" --with-tail-call-interp --without-ensurepip \
    --disable-test-modules
  make -j"$(nproc)"
  make install
) >"$OUT/build.log" 2>&1 || die "build failed; see the end of $OUT/build.log"
echo "build-python-tailcall: CPython $UPV built and installed in $(($(date +%s) - start)) s" >&2
tail_ok || die "$PY is not a tail-calling interpreter"
rm -rf "$OUT/build" "$OUT/gomod"
echo "$UPV clang-19" >"$OUT/.complete"
echo "$PY"
