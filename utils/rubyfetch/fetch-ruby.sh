#!/bin/bash
# fetch-ruby.sh VERSION [ARCH] - a Debian CRuby build (3.1, 3.3 or 3.4) for the profiler's Ruby
# tests, for this machine or a foreign ARCH (arm64: unpacked here, never run; detection is tested
# on it and the kernel matrix's arm64 VMs run it).
#
# Downloads ruby$VERSION and libruby$VERSION from the Debian suite that carries it (3.1: bookworm
# with its security updates, 3.3: trixie, 3.4: experimental over sid) with the libraries they link
# against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/ruby-VERSION-ARCH/root/
# The newer suites' builds need glibc >= 2.38 (Debian 12 has 2.36), and a foreign architecture's
# build gets its own suite's C library wherever it is copied to: their libc6 is unpacked too and
# the ruby executable is pointed at that loader and the unpacked libraries with patchelf (PT_INTERP
# and DT_RPATH), so the process is the genuine ruby executable mapping the genuine libruby, which is
# what the profiler keys on. rubylib in the cache dir holds the unpacked standard library's
# directories (the executable looks for it under /usr), which RUBYLIB must name, and bin/ruby is a
# wrapper that sets it and execs the executable.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# wrapper's path.
set -euo pipefail

die() { echo "fetch-ruby: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 3.1|3.3|3.4 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
case $V in
  3.1) SUITE=bookworm SECURITY=1 NEW_LIBC=0 ;;
  3.3) SUITE=trixie SECURITY=0 NEW_LIBC=1 ;;
  3.4) SUITE="sid experimental" SECURITY=0 NEW_LIBC=1 ;;
  *) die "no Debian suite known for Ruby $V" ;;
esac
FOREIGN=0
[ "$RUNTIME_ARCH" = "$HOST" ] || FOREIGN=1 NEW_LIBC=1
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
. "$(dirname "$0")/../debfetch/runtime-debs.sh"
OUT=$BASE/ruby-$V-$RUNTIME_ARCH ROOT=$BASE/ruby-$V-$RUNTIME_ARCH/root WRAPPER=$BASE/ruby-$V-$RUNTIME_ARCH/bin/ruby
LIBDIR=$ROOT/usr/lib/$(runtime_triplet) RUBY=$ROOT/usr/bin/ruby$V
runs() { [ "$FOREIGN" = 1 ] || "$WRAPPER" -e 'exit 0' >/dev/null 2>&1; }
if [ -f "$OUT/.complete" ] && [ -f "$OUT/rubylib" ] && runs; then echo "$WRAPPER"; exit 0; fi

# A foreign architecture's tree holds every library the programs load, and
# runtime_libdeps leaves out zlib1g (not named lib*) and libbsd's libmd; here
# the host has its own.
[ "$FOREIGN" = 0 ] || export RUNTIME_EXTRA_LIBS="zlib1g libmd0"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" "ruby$V" "libruby$V" || die "unpacking Ruby $V failed"
[ -x "$RUBY" ] || die "$RUBY missing after unpacking"
point_at_root "$RUBY" "$ROOT" "$NEW_LIBC" || die "patchelf $RUBY failed"

API=$(ls "$ROOT/usr/lib/ruby" | grep -E "^$V\.[0-9]+$" | head -1)
[ -n "$API" ] || die "no standard library directory for $V under $ROOT/usr/lib/ruby"
mkdir -p "$(dirname "$WRAPPER")"
echo "$ROOT/usr/lib/ruby/vendor_ruby:$ROOT/usr/lib/ruby/$API:$LIBDIR/ruby/$API" >"$OUT/rubylib"
cat >"$WRAPPER" <<W
#!/bin/sh
# CRuby $V from Debian $SUITE with its own libraries (written by fetch-ruby.sh).
RUBYLIB='$ROOT/usr/lib/ruby/vendor_ruby:$ROOT/usr/lib/ruby/$API:$LIBDIR/ruby/$API' exec '$RUBY' "\$@"
W
chmod +x "$WRAPPER"
[ "$FOREIGN" = 1 ] || "$WRAPPER" -e 'puts RUBY_DESCRIPTION' >&2 || die "$WRAPPER does not run"
dpkg-deb -f "$(ls "$OUT"/debs/libruby"$V"_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$WRAPPER"
