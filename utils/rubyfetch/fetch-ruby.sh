#!/bin/bash
# fetch-ruby.sh VERSION - a Debian CRuby build (3.1, 3.3 or 3.4) for the profiler's Ruby tests.
#
# Downloads ruby$VERSION and libruby$VERSION from the Debian suite that carries it (3.1: bookworm
# with its security updates, 3.3: trixie, 3.4: experimental over sid) with the libraries they link
# against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/ruby-VERSION-amd64/root/
# The newer suites' builds need glibc >= 2.38 (Debian 12 has 2.36): their libc6 is unpacked too and
# the ruby executable is pointed at that loader and the unpacked libraries with patchelf (PT_INTERP
# and DT_RPATH), so the process is the genuine ruby executable mapping the genuine libruby, which is
# what the profiler keys on. bin/ruby in the cache dir is a wrapper that sets RUBYLIB to the
# unpacked standard library (the executable looks for it under /usr) and execs it.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# wrapper's path.
set -euo pipefail

die() { echo "fetch-ruby: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 3.1|3.3|3.4"
V=$1
case $V in
  3.1) SUITE=bookworm SECURITY=1 NEW_LIBC=0 ;;
  3.3) SUITE=trixie SECURITY=0 NEW_LIBC=1 ;;
  3.4) SUITE="sid experimental" SECURITY=0 NEW_LIBC=1 ;;
  *) die "no Debian suite known for Ruby $V" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is fetched"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/ruby-$V-amd64 ROOT=$BASE/ruby-$V-amd64/root WRAPPER=$BASE/ruby-$V-amd64/bin/ruby
LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu RUBY=$ROOT/usr/bin/ruby$V
if [ -f "$OUT/.complete" ] && "$WRAPPER" -e 'exit 0' >/dev/null 2>&1; then echo "$WRAPPER"; exit 0; fi

. "$(dirname "$0")/../debfetch/runtime-debs.sh"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" "ruby$V" "libruby$V" || die "unpacking Ruby $V failed"
[ -x "$RUBY" ] || die "$RUBY missing after unpacking"
point_at_root "$RUBY" "$ROOT" "$NEW_LIBC" || die "patchelf $RUBY failed"

API=$(ls "$ROOT/usr/lib/ruby" | grep -E "^$V\.[0-9]+$" | head -1)
[ -n "$API" ] || die "no standard library directory for $V under $ROOT/usr/lib/ruby"
mkdir -p "$(dirname "$WRAPPER")"
cat >"$WRAPPER" <<W
#!/bin/sh
# CRuby $V from Debian $SUITE with its own libraries (written by fetch-ruby.sh).
RUBYLIB='$ROOT/usr/lib/ruby/vendor_ruby:$ROOT/usr/lib/ruby/$API:$LIBDIR/ruby/$API' exec '$RUBY' "\$@"
W
chmod +x "$WRAPPER"
"$WRAPPER" -e 'puts RUBY_DESCRIPTION' >&2 || die "$WRAPPER does not run"
dpkg-deb -f "$(ls "$OUT"/debs/libruby"$V"_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$WRAPPER"
