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

. "$(dirname "$0")/../debfetch/private-apt.sh"
mkdir -p "$OUT/debs"
MIRROR=$(debian_mirror) || die "no Debian mirror"
security=""
[ "$SECURITY" = 1 ] && security="${MIRROR%/debian}/debian-security"
private_apt "$BASE/apt-ruby-${SUITE// /-}-amd64" amd64 "$SUITE" $security || die "no apt lists for $SUITE"

# The interpreter packages (from experimental where that is the suite), plus two levels of their
# lib* runtime dependencies; the host's own libc serves bookworm's build.
CORE="ruby$V libruby$V"
REL=""
case $SUITE in *experimental*) REL=/experimental ;; esac
libdeps() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$@" |
    awk '/Depends:/ && $2 ~ /^lib/ && $2 !~ /-dev$|gconv|^libruby/ {print $2}' | tr -d '<>' | sort -u
}
L1=$(libdeps $CORE)
LIBS=$(printf '%s\n' $L1 $(libdeps $L1) | sort -u)
[ "$NEW_LIBC" = 1 ] || LIBS=$(printf '%s\n' $LIBS | grep -v '^libc6$' || true)
(cd "$OUT/debs" && apt-get -q download $(for p in $CORE; do echo "$p$REL"; done) $LIBS >&2) ||
  die "downloading $CORE $(echo $LIBS) failed"

rm -rf "$OUT/root.new" && mkdir "$OUT/root.new"
for p in $CORE $LIBS; do dpkg-deb -x "$(ls "$OUT"/debs/"${p}"_*.deb | sort -V | tail -1)" "$OUT/root.new"; done
rm -rf "$ROOT" && mv "$OUT/root.new" "$ROOT"
[ -x "$RUBY" ] || die "$RUBY missing after unpacking"

command -v patchelf >/dev/null || die "patchelf missing (install-test-deps.sh installs it)"
if [ "$NEW_LIBC" = 1 ]; then
  LDSO=$LIBDIR/ld-linux-x86-64.so.2
  [ -x "$LDSO" ] || die "no dynamic loader in the unpacked libc6"
  patchelf --set-interpreter "$LDSO" "$RUBY"
fi
patchelf --force-rpath --set-rpath "$LIBDIR" "$RUBY"

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
