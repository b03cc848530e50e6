#!/bin/bash
# fetch-php.sh VERSION [ARCH] - a Debian PHP build for the profiler's PHP tests: 8.4 for this machine
# (Debian 12's own 8.2 is installed by install-test-deps.sh), or 8.2 or 8.4 for a foreign ARCH
# (arm64: the kernel matrix's VMs run it; it is unpacked here, never run).
#
# Downloads php$VERSION's CLI, FPM, OPcache, Apache module and headers (-dev: the layout test compiles against
# them) from the Debian suite that carries it (8.2: bookworm, 8.4: trixie, with their security
# updates) with the libraries they link against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/php-VERSION-ARCH/root/
# Trixie's builds need glibc >= 2.38 (Debian 12 has 2.36), and a foreign architecture's build
# gets its own suite's libc wherever it is copied to: libc6 is unpacked too and the php and
# php-fpm executables are pointed at that loader and the unpacked libraries with patchelf
# (PT_INTERP and DT_RPATH), so the processes are the genuine executables, which is what the
# profiler keys on. They are run with -n (no php.ini) and OPcache loaded by its path.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# php executable's path.
set -euo pipefail

die() { echo "fetch-php: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 8.2|8.4 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
case $V in
  8.2) SUITE=bookworm SECURITY=1 NEW_LIBC=0 ;;
  8.4) SUITE=trixie SECURITY=1 NEW_LIBC=1 ;;
  *) die "no Debian suite known for PHP $V" ;;
esac
FOREIGN=0
if [ "$RUNTIME_ARCH" != "$HOST" ]; then
  FOREIGN=1 NEW_LIBC=1
elif [ "$V" = 8.2 ]; then
  die "PHP 8.2 is Debian 12's own here (install-test-deps.sh installs it)"
fi
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/php-$V-$RUNTIME_ARCH ROOT=$BASE/php-$V-$RUNTIME_ARCH/root
PHP=$ROOT/usr/bin/php$V FPM=$ROOT/usr/sbin/php-fpm$V
runs() { [ "$FOREIGN" = 1 ] || "$PHP" -n -r 'exit(0);' >/dev/null 2>&1; }
if [ -f "$OUT/.complete" ] && [ -d "$ROOT/usr/include/php" ] && [ -f "$ROOT/usr/lib/apache2/modules/libphp$V.so" ] && runs; then
  echo "$PHP"
  exit 0
fi

. "$(dirname "$0")/../debfetch/runtime-debs.sh"
# A foreign architecture's tree holds every library the programs load, and
# runtime_libdeps leaves out zlib1g (not named lib*) and a third level of
# dependencies (libxml2 -> libicu -> libstdc++, libsystemd -> libgcrypt ->
# libgpg-error, libedit -> libbsd -> libmd); here the host has its own.
[ "$FOREIGN" = 0 ] || export RUNTIME_EXTRA_LIBS="zlib1g libstdc++6 libgpg-error0 libmd0"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" "php$V-cli" "php$V-fpm" "php$V-opcache" "php$V-common" "php$V-dev" \
  "libapache2-mod-php$V" ||
  die "unpacking PHP $V failed"
for exe in "$PHP" "$FPM"; do
  [ -x "$exe" ] || die "$exe missing after unpacking"
  point_at_root "$exe" "$ROOT" "$NEW_LIBC" || die "patchelf $exe failed"
done
if [ "$FOREIGN" = 0 ]; then
  "$PHP" -n -v >&2 || die "$PHP does not run"
  "$FPM" -n -v >&2 || die "$FPM does not run"
fi
dpkg-deb -f "$(ls "$OUT"/debs/php"$V"-cli_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$PHP"
