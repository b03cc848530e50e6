#!/bin/bash
# fetch-python.sh VERSION [ARCH] - a CPython newer than pyenv has, for the profiler's Python tests.
#
# Downloads Debian's (sid by default) python$VERSION-minimal, libpython$VERSION{,-minimal,-stdlib,-dev}
# and the libraries they link against (sid's own libc6 too: the interpreter needs a newer glibc than
# the host's), unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/python-VERSION-ARCH/root/
# and writes bin/python3 there: a wrapper that runs the real root/usr/bin/pythonVERSION through the
# unpacked dynamic loader. So the process maps the genuine interpreter ELF, which is what the profiler
# keys on, and the -dev headers (root/usr/include/pythonVERSION/internal/) are at hand for offsets.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are untouched.
# For this machine's architecture, Debian's debug build (python$VERSION-dbg, libpython$VERSION-dbg:
# Py_DEBUG, with its own extension modules) is unpacked into the same root, run by bin/python3d.
# Idempotent: a finished cache dir is reused without network. Last line of stdout: the wrapper's path.
# Env: PYFETCH_SUITE (default sid). A foreign ARCH is fetched and unpacked but cannot run here.
set -euo pipefail

die() { echo "fetch-python: $*" >&2; exit 1; }
[ $# -ge 1 ] || die "usage: $0 VERSION [ARCH]   e.g. $0 3.14"
V=$1 ARCH=${2:-$(dpkg --print-architecture)} SUITE=${PYFETCH_SUITE:-sid}
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/python-$V-$ARCH WRAPPER=$OUT/bin/python3
if [ -f "$OUT/.complete" ] && [ -x "$WRAPPER" ]; then echo "$WRAPPER"; exit 0; fi

# Private apt config: the system's Debian mirror, with SUITE added, for ARCH only.
. "$(dirname "$0")/../debfetch/private-apt.sh"
mkdir -p "$OUT/debs"
private_apt "$BASE/apt-$SUITE-$ARCH" "$ARCH" "$SUITE" || die "no apt lists for $SUITE"
apt-cache show "python$V-minimal" >/dev/null 2>&1 ||
  die "Debian $SUITE has no CPython $V for $ARCH (no package python$V-minimal)"

# The interpreter packages, plus two levels of their lib* runtime dependencies (libc6 -> libgcc-s1).
# Not followed: data packages (tzdata, netbase, ...), -dev deps, and glibc's gconv modules (unused).
CORE="python$V-minimal libpython$V-minimal libpython$V-stdlib libpython$V libpython$V-dev"
libdeps() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$@" |
    awk '/Depends:/ && $2 ~ /^lib/ && $2 !~ /-dev$|gconv/ {print $2}' | sort -u
}
[ "$ARCH" != "$(dpkg --print-architecture)" ] || CORE="$CORE python$V-dbg libpython$V-dbg"
L1=$(libdeps $CORE)
PKGS=$(printf '%s\n' $CORE $L1 $(libdeps $L1) | sort -u)
(cd "$OUT/debs" && apt-get -q download $PKGS >&2) || die "downloading $(echo $PKGS) failed"

# Unpack into a fresh root; only a complete one replaces the old.
rm -rf "$OUT/root.new" && mkdir "$OUT/root.new"
for p in $PKGS; do dpkg-deb -x "$(ls "$OUT"/debs/"${p}"_*.deb | sort -V | tail -1)" "$OUT/root.new"; done
rm -rf "$OUT/root" && mv "$OUT/root.new" "$OUT/root"
LDSO=$(find "$OUT/root/usr/lib" -maxdepth 2 -name 'ld-linux*.so.*' -type f | head -1)
[ -n "$LDSO" ] || die "no dynamic loader in the unpacked libc6"
PY=$OUT/root/usr/bin/python$V
[ -x "$PY" ] || die "$PY missing after unpacking"

# --argv0 makes sys.executable the wrapper, so subprocesses of sys.executable work too.
mkdir -p "$OUT/bin"
cat >"$WRAPPER" <<EOF
#!/bin/sh
# CPython $V from Debian $SUITE, run by its own loader and libraries (written by fetch-python.sh).
PYTHONHOME='$OUT/root/usr' exec '$LDSO' --library-path '$(dirname "$LDSO")' --argv0 '$WRAPPER' '$PY' "\$@"
EOF
chmod +x "$WRAPPER"
if [ -x "$OUT/root/usr/bin/python${V}d" ]; then
  cat >"$OUT/bin/python3d" <<EOF
#!/bin/sh
# CPython $V's debug build from Debian $SUITE, run by its own loader and libraries (written by fetch-python.sh).
PYTHONHOME='$OUT/root/usr' exec '$LDSO' --library-path '$(dirname "$LDSO")' --argv0 '$OUT/bin/python3d' '$OUT/root/usr/bin/python${V}d' "\$@"
EOF
  chmod +x "$OUT/bin/python3d"
fi
dpkg-deb -f "$(ls "$OUT"/debs/python"$V"-minimal_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$WRAPPER"
