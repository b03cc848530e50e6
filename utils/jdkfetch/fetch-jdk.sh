#!/bin/bash
# fetch-jdk.sh VERSION [ARCH] - a Debian OpenJDK build for the profiler's HotSpot tests: 8, 11,
# 21, 25 or 26 for this machine (Debian 12's own 17 is installed by install-test-deps.sh), or any
# of them and 17 for a foreign ARCH (arm64: the kernel matrix's VMs run it; it is unpacked here,
# never run).
#
# Downloads openjdk-VERSION-jre-headless (and, for this machine, -jdk-headless) from the suite that
# carries it (11: bullseye, 17: bookworm, 21 and 25: trixie, each with its security updates,
# but 11 for arm64 without them; 8 and 26: sid, which has no security suite) and
# unpacks it with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/jdk-VERSION-ARCH/root/
# Trixie's and sid's builds need glibc >= 2.38 (Debian 12 has 2.36), and a foreign architecture's build gets
# its own suite's libc and the few libraries libjvm.so and the launcher load (libstdc++, libgcc,
# zlib) wherever it is copied to: the JDK's executables (not its libraries) are pointed at that
# loader and those libraries with patchelf (PT_INTERP and DT_RPATH, which, unlike RUNPATH, also
# serves the libraries libjvm.so loads). So the process is the genuine java executable mapping the
# genuine libjvm.so, which is what the profiler keys on, and child processes (jspawnhelper) work
# too. Absolute symlinks into /etc/java-VERSION-openjdk are repointed into the unpacked tree.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# java executable's path (JAVA_HOME is two directories up).
set -euo pipefail

die() { echo "fetch-jdk: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 8|11|17|21|25|26 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
SECURITY=1
case $V in
  11) SUITE=bullseye NEW_LIBC=0 ;;
  17) SUITE=bookworm NEW_LIBC=0 ;;
  21 | 25) SUITE=trixie NEW_LIBC=1 ;;
  # Only sid carries these two among the suites here; sid has no -security suite.
  8 | 26) SUITE=sid NEW_LIBC=1 SECURITY=0 ;;
  *) die "no suite known for OpenJDK $V" ;;
esac
FOREIGN=0 PKGS="openjdk-$V-jre-headless"
if [ "$RUNTIME_ARCH" != "$HOST" ]; then
  FOREIGN=1 NEW_LIBC=1
  # The mirror serves bullseye-security's lists but not its arm64 packages.
  [ "$V" != 11 ] || SECURITY=0
  # Only what the VMs load: javac runs here.
  export RUNTIME_LIBDEPS=0 RUNTIME_EXTRA_LIBS="libc6 libstdc++6 libgcc-s1 zlib1g"
elif [ "$V" = 17 ]; then
  die "OpenJDK 17 is Debian 12's own here (install-test-deps.sh installs it)"
else
  PKGS="$PKGS openjdk-$V-jdk-headless"
  export RUNTIME_LIBDEPS=0 RUNTIME_EXTRA_LIBS=""
  [ "$NEW_LIBC" = 0 ] || RUNTIME_EXTRA_LIBS=libc6
fi
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/jdk-$V-$RUNTIME_ARCH ROOT=$BASE/jdk-$V-$RUNTIME_ARCH/root
JH=$ROOT/usr/lib/jvm/java-$V-openjdk-$RUNTIME_ARCH
JAVA=$JH/bin/java
runs() { [ "$FOREIGN" = 1 ] || "$JAVA" -version >/dev/null 2>&1; }
if [ -f "$OUT/.complete" ] && [ -x "$JAVA" ] && runs; then echo "$JAVA"; exit 0; fi

. "$(dirname "$0")/../debfetch/runtime-debs.sh"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" $PKGS || die "unpacking OpenJDK $V failed"
[ -x "$JAVA" ] || die "$JAVA missing after unpacking"

# jvm.cfg, java.security and others link to /etc/java-$V-openjdk, which the host lacks.
find "$ROOT" -type l | while IFS= read -r l; do
  t=$(readlink "$l")
  case $t in /*) if [ -e "$ROOT$t" ]; then ln -sfn "$ROOT$t" "$l"; fi ;; esac
done

# 8 keeps the runtime's executables in jre/bin (bin/java links there) and jexec in jre/lib.
for f in "$JH"/bin/* "$JH"/lib/jspawnhelper "$JH"/lib/jexec "$JH"/jre/bin/* "$JH"/jre/lib/jexec; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  patchelf --print-interpreter "$f" >/dev/null 2>&1 || continue # not a dynamic executable
  point_at_root "$f" "$ROOT" "$NEW_LIBC" || die "patchelf $f failed"
done
if [ "$FOREIGN" = 0 ]; then
  "$JAVA" -version >&2 || die "$JAVA does not run"
  # Debian's postinst makes the class data sharing archive, which 11's package lacks.
  [ -f "$JH/lib/server/classes.jsa" ] || "$JAVA" -Xshare:dump >/dev/null 2>&1 || true
fi
dpkg-deb -f "$(ls "$OUT"/debs/openjdk-"$V"-jre-headless_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$JAVA"
