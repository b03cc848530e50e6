#!/bin/bash
# fetch-php.sh VERSION - a Debian PHP build (8.4) for the profiler's PHP tests.
#
# Downloads php$VERSION's CLI, FPM, OPcache, Apache module and headers (-dev: the layout test compiles against
# them) from the Debian suite that carries it (8.4: trixie
# with its security updates) with the libraries they link against, and unpacks them with
# dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/php-VERSION-amd64/root/
# Trixie's builds need glibc >= 2.38 (Debian 12 has 2.36): its libc6 is unpacked too and the php
# and php-fpm executables are pointed at that loader and the unpacked libraries with patchelf
# (PT_INTERP and DT_RPATH), so the processes are the genuine executables, which is what the
# profiler keys on. They are run with -n (no php.ini) and OPcache loaded by its path.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# php executable's path. (Debian 12's own 8.2 is installed by install-test-deps.sh.)
set -euo pipefail

die() { echo "fetch-php: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 8.4"
V=$1
case $V in
  8.4) SUITE=trixie SECURITY=1 NEW_LIBC=1 ;;
  *) die "no Debian suite known for PHP $V" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is fetched"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/php-$V-amd64 ROOT=$BASE/php-$V-amd64/root
PHP=$ROOT/usr/bin/php$V FPM=$ROOT/usr/sbin/php-fpm$V
if [ -f "$OUT/.complete" ] && [ -d "$ROOT/usr/include/php" ] && [ -f "$ROOT/usr/lib/apache2/modules/libphp$V.so" ] && "$PHP" -n -r 'exit(0);' >/dev/null 2>&1; then
  echo "$PHP"
  exit 0
fi

. "$(dirname "$0")/../debfetch/runtime-debs.sh"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" "php$V-cli" "php$V-fpm" "php$V-opcache" "php$V-common" "php$V-dev" \
  "libapache2-mod-php$V" ||
  die "unpacking PHP $V failed"
for exe in "$PHP" "$FPM"; do
  [ -x "$exe" ] || die "$exe missing after unpacking"
  point_at_root "$exe" "$ROOT" "$NEW_LIBC" || die "patchelf $exe failed"
done
"$PHP" -n -v >&2 || die "$PHP does not run"
"$FPM" -n -v >&2 || die "$FPM does not run"
dpkg-deb -f "$(ls "$OUT"/debs/php"$V"-cli_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$PHP"
