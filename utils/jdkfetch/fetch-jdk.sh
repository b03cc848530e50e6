#!/bin/bash
# fetch-jdk.sh VERSION - a Debian OpenJDK build (11, 21 or 25) for the profiler's HotSpot tests.
#
# Debian 12 ships OpenJDK 17 only. This downloads openjdk-VERSION-jre-headless and -jdk-headless
# from the suite that carries it (11: bullseye, 21 and 25: trixie, each with its security
# updates) and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/jdk-VERSION-amd64/root/
# Trixie's builds need glibc >= 2.38 (Debian 12 has 2.36): trixie's libc6 is unpacked beside
# them and the JDK's executables (not its libraries) are pointed at that loader and libc with
# patchelf (PT_INTERP and DT_RPATH, which, unlike RUNPATH, also serves the libraries libjvm.so
# loads). So the process is the genuine java executable mapping the genuine libjvm.so, which is
# what the profiler keys on, and child processes (jspawnhelper) work too. Absolute symlinks into
# /etc/java-VERSION-openjdk are repointed into the unpacked tree.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout:
# the java executable's path (JAVA_HOME is two directories up).
set -euo pipefail

die() { echo "fetch-jdk: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 11|21|25"
V=$1
case $V in
  11) SUITE=bullseye NEW_LIBC=0 ;;
  21 | 25) SUITE=trixie NEW_LIBC=1 ;;
  *) die "no suite known for OpenJDK $V" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is fetched"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/jdk-$V-amd64 ROOT=$BASE/jdk-$V-amd64/root
JH=$ROOT/usr/lib/jvm/java-$V-openjdk-amd64 LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu
JAVA=$JH/bin/java
if [ -f "$OUT/.complete" ] && "$JAVA" -version >/dev/null 2>&1; then echo "$JAVA"; exit 0; fi

# Private apt config: the system's Debian mirror and its security mirror with SUITE.
. "$(dirname "$0")/../debfetch/private-apt.sh"
mkdir -p "$OUT/debs"
MIRROR=$(debian_mirror) || die "no Debian mirror"
private_apt "$BASE/apt-jdk-$SUITE-amd64" amd64 "$SUITE" "${MIRROR%/debian}/debian-security" ||
  die "no apt lists for $SUITE"

PKGS="openjdk-$V-jre-headless openjdk-$V-jdk-headless"
[ "$NEW_LIBC" = 1 ] && PKGS="$PKGS libc6"
(cd "$OUT/debs" && apt-get -q download $PKGS >&2) || die "downloading $PKGS failed"

# Unpack into a fresh root; only a complete one replaces the old.
rm -rf "$OUT/root.new" && mkdir "$OUT/root.new"
for p in $PKGS; do dpkg-deb -x "$(ls "$OUT"/debs/"${p}"_*.deb | sort -V | tail -1)" "$OUT/root.new"; done
rm -rf "$ROOT" && mv "$OUT/root.new" "$ROOT"
[ -x "$JAVA" ] || die "$JAVA missing after unpacking"

# jvm.cfg, java.security and others link to /etc/java-$V-openjdk, which the host lacks.
find "$ROOT" -type l | while IFS= read -r l; do
  t=$(readlink "$l")
  case $t in /*) if [ -e "$ROOT$t" ]; then ln -sfn "$ROOT$t" "$l"; fi ;; esac
done

if [ "$NEW_LIBC" = 1 ]; then
  command -v patchelf >/dev/null || die "patchelf missing (install-test-deps.sh installs it)"
  LDSO=$LIBDIR/ld-linux-x86-64.so.2
  [ -x "$LDSO" ] || die "no dynamic loader in the unpacked libc6"
  for f in "$JH"/bin/* "$JH"/lib/jspawnhelper "$JH"/lib/jexec; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    patchelf --print-interpreter "$f" >/dev/null 2>&1 || continue # not a dynamic executable
    rpath=$(patchelf --print-rpath "$f")
    patchelf --set-interpreter "$LDSO" --force-rpath --set-rpath "${rpath:+$rpath:}$LIBDIR" "$f"
  done
fi
"$JAVA" -version >&2 || die "$JAVA does not run"
# Debian's postinst makes the class data sharing archive, which 11's package lacks.
[ -f "$JH/lib/server/classes.jsa" ] || "$JAVA" -Xshare:dump >/dev/null 2>&1 || true
dpkg-deb -f "$(ls "$OUT"/debs/openjdk-"$V"-jre-headless_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$JAVA"
