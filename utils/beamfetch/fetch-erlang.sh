#!/bin/bash
# fetch-erlang.sh VERSION [ARCH] - a Debian Erlang/OTP build for the profiler's BEAM tests: OTP 27
# (trixie's erlang-base 1:27.3.4.1) or OTP 29 (sid's 1:29.1.2), for this machine or a foreign ARCH
# (arm64: unpacked here, never run; the unit tests decode its beam.smp).
#
# Downloads erlang-base (the emulator beam.smp, erlexec, erlc, escript, kernel, stdlib, compiler)
# and, for OTP 29, Debian's elixir with the OTP applications it needs, from the suite that carries
# them, with the libraries they link against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/erlang-VERSION-ARCH/root/
# Both suites' builds need glibc >= 2.38 (Debian 12 has 2.36): their libc6 is unpacked too and
# every ELF executable of the emulator's bin directory is pointed at that loader and the unpacked
# libraries with patchelf (PT_INTERP and DT_RPATH), so the process is the genuine, stripped
# beam.smp, which is what the profiler keys on. Debian's launcher scripts name /usr/lib/erlang as
# ROOTDIR: the unpacked copies are rewritten to name the unpacked tree, and bin/erl, bin/erlc,
# bin/escript (and bin/elixir for 29) in the cache dir are wrappers that run them.
# Debian keeps no erlang-base-dbgsym in the main archive and the debug archive (debian-debug) is not
# reachable from here: the stripped build is the only one.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# erl wrapper's path.
set -euo pipefail

die() { echo "fetch-erlang: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 27|29 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
ELIXIR=0
case $V in
  27) SUITE=trixie SECURITY=1 ;;
  29) SUITE=sid SECURITY=0 ELIXIR=1 ;;
  *) die "no Debian suite known for Erlang/OTP $V" ;;
esac
NEW_LIBC=1
FOREIGN=0
[ "$RUNTIME_ARCH" = "$HOST" ] || FOREIGN=1
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/erlang-$V-$RUNTIME_ARCH ROOT=$BASE/erlang-$V-$RUNTIME_ARCH/root
ERLROOT=$ROOT/usr/lib/erlang
runs() {
  [ "$FOREIGN" = 1 ] && return 0
  "$OUT/bin/erl" -noshell -eval 'halt().' >/dev/null 2>&1 || return 1
  [ "$ELIXIR" = 0 ] || "$OUT/bin/elixir" -e ':ok' >/dev/null 2>&1
}
if [ -f "$OUT/.complete" ] && runs; then echo "$OUT/bin/erl"; exit 0; fi

. "$(dirname "$0")/../debfetch/runtime-debs.sh"
# runtime_libdeps leaves out zlib1g (not named lib*); a foreign architecture's tree holds every
# library the programs load, here the host has its own for the rest.
export RUNTIME_EXTRA_LIBS="zlib1g"
pkgs=(erlang-base)
# elixir's dependencies (apt-cache depends elixir) and theirs among OTP's applications.
[ "$ELIXIR" = 0 ] || pkgs+=(elixir erlang-crypto erlang-inets erlang-parsetools erlang-public-key erlang-asn1
  erlang-tools erlang-runtime-tools erlang-mnesia erlang-syntax-tools)
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" "${pkgs[@]}" || die "unpacking Erlang/OTP $V failed"

ERTS=$(ls -d "$ERLROOT"/erts-* 2>/dev/null | sort -V | tail -1)
[ -n "$ERTS" ] && [ -f "$ERTS/bin/beam.smp" ] || die "no erts-*/bin/beam.smp under $ERLROOT after unpacking"
# The ELF executables the emulator runs (beam.smp, erlexec, erl_child_setup, inet_gethost, epmd,
# erlc, escript, ...), each pointed at the unpacked libc.
for exe in "$ERTS"/bin/*; do
  [ -f "$exe" ] && [ "$(head -c4 "$exe" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
  patchelf --print-interpreter "$exe" >/dev/null 2>&1 || continue
  point_at_root "$exe" "$ROOT" "$NEW_LIBC" || die "patchelf $exe failed"
done
# Debian's launchers hard-code ROOTDIR (erl, start, ... in bin/ and erts-*/bin/).
for s in "$ERLROOT"/bin/* "$ERTS"/bin/*; do
  [ -f "$s" ] && [ ! -L "$s" ] && head -c2 "$s" | grep -q '#!' || continue
  sed -i "s|ROOTDIR=/usr/lib/erlang\$|ROOTDIR=$ERLROOT|" "$s"
done
# erlc and escript run the erl they find beside themselves (erts-*/bin/erl, the rewritten script).
mkdir -p "$OUT/bin"
for t in erl erlc escript; do
  case $t in erl) target="$ERLROOT/bin/erl" ;; *) target="$ERTS/bin/$t" ;; esac
  [ -x "$target" ] || die "$target missing after unpacking"
  cat >"$OUT/bin/$t" <<W
#!/bin/sh
# $t of Erlang/OTP $V from Debian $SUITE with its own libraries (written by fetch-erlang.sh).
PATH='$ERLROOT/bin':\$PATH exec '$target' "\$@"
W
  chmod +x "$OUT/bin/$t"
done
if [ "$ELIXIR" = 1 ]; then
  EX=$ROOT/usr/lib/elixir/bin/elixir
  [ -x "$EX" ] || die "$EX missing after unpacking"
  cat >"$OUT/bin/elixir" <<W
#!/bin/sh
# Debian's elixir on Erlang/OTP $V from Debian $SUITE (written by fetch-erlang.sh): its script runs
# the erl it finds on PATH.
PATH='$ERLROOT/bin':\$PATH exec '$EX' "\$@"
W
  chmod +x "$OUT/bin/elixir"
fi
if [ "$FOREIGN" = 0 ]; then
  flavor=$("$OUT/bin/erl" -noshell -eval 'io:format("~s~n",[erlang:system_info(emu_flavor)]), halt().') ||
    die "$OUT/bin/erl does not run"
  echo "Erlang/OTP $V $RUNTIME_ARCH: emu_flavor $flavor" >&2
  case $RUNTIME_ARCH in amd64 | arm64) [ "$flavor" = jit ] || die "OTP $V on $RUNTIME_ARCH runs flavor $flavor, want jit" ;; esac
  [ "$ELIXIR" = 0 ] || "$OUT/bin/elixir" -e 'IO.puts("Elixir #{System.version()}")' >&2 || die "$OUT/bin/elixir does not run"
fi
dpkg-deb -f "$(ls "$OUT"/debs/erlang-base_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$OUT/bin/erl"
