#!/bin/bash
# build-ruby-yjit.sh VERSION - a CRuby source build with YJIT (3.3, 3.4) for the profiler's Ruby tests.
#
# Debian builds ruby3.3 and ruby3.4 with --disable-yjit, so YJIT's code on the stack is only seen
# under a build of our own. This one builds the upstream release Debian carries: the .orig tarball
# of the ruby$VERSION source package (3.3: trixie, 3.4: experimental), fetched with apt-get source under a
# private APT_CONFIG (utils/debfetch/private-apt.sh), which checks it against the signed Sources
# index. If the mirror lacks the newest version's files, the next older listed version is taken.
# It is configured with --enable-shared --with-soname=ruby-VERSION (libruby-VERSION.so.*, named as
# Debian names it) --enable-yjit (rustc >= 1.58; Debian 12's rustc package is 1.63), and without
# the optional features that configure would pick up from whatever the machine has (GMP, dtrace,
# a system ruby as BASERUBY), so that every machine builds the same; built with make -j$(nproc)
# and installed under
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/ruby-VERSION-yjit-amd64/root/
# whose bin/ruby runs as is (the prefix is where it was installed). Extensions whose libraries are
# missing are skipped by Ruby's build itself; the ones a test may want are listed on stderr.
# Missing build dependencies are installed from the system's Debian 12 with apt-get. Idempotent: a
# finished cache dir is reused without network or rebuild. Last line of stdout: the ruby path.
set -euo pipefail

die() { echo "build-ruby-yjit: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 3.3|3.4 [static]"
V=$1 KIND=${2:-shared}
# The suite whose ruby$V source package is built.
# (whose source the mirror has), and a case in rubies.go's YJIT.
case $V in
  3.3) SUITE=trixie ;;
  3.4) SUITE=experimental ;;
  *) die "no YJIT source build known for Ruby $V" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is built"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
case $KIND in
  # A libruby-VERSION.so beside the ruby executable, as Debian and most installers build it.
  shared) OUT=$BASE/ruby-$V-yjit-amd64 LINK=(--enable-shared --with-soname="ruby-$V") ;;
  # The interpreter linked into the ruby executable, as ruby-build (rbenv) builds it by default.
  static) OUT=$BASE/ruby-$V-static-amd64 LINK=(--disable-shared) ;;
  *) die "build kind $KIND: shared or static" ;;
esac
ROOT=$OUT/root
RUBY=$ROOT/bin/ruby
yjit_ok() { [ "$("$RUBY" --yjit -e 'p RubyVM::YJIT.enabled?' 2>/dev/null)" = true ]; }
if [ -f "$OUT/.complete" ] && yjit_ok; then echo "$RUBY"; exit 0; fi

# shellcheck source=../debfetch/private-apt.sh
. "$(dirname "$0")/../debfetch/private-apt.sh"
# Build dependencies, from the system's own apt configuration (before private_apt replaces it).
deps=(gcc make libc6-dev xz-utils libssl-dev libyaml-dev zlib1g-dev libffi-dev)
command -v rustc >/dev/null || deps+=(rustc)
install_missing "${deps[@]}" || die "missing build dependencies"
rv=$(rustc --version | awk '{print $2}')
[ "$(printf '%s\n' 1.58.0 "$rv" | sort -V | head -1)" = 1.58.0 ] || die "rustc $rv is older than 1.58, which YJIT needs"

PRIVATE_APT_TYPES=deb-src private_apt "$BASE/apt-src-$SUITE" amd64 "$SUITE" || die "no apt source lists for $SUITE"
mkdir -p "$OUT/src"
DEBV=""
for v in $(apt-cache showsrc --only-source "ruby$V" | awk '/^Version:/ {print $2}' | sort -V -r -u); do
  if (cd "$OUT/src" && apt-get -q source --download-only --tar-only "ruby$V=$v" >&2); then DEBV=$v; break; fi
  echo "build-ruby-yjit: ruby$V $v is listed but not downloadable; trying an older version" >&2
done
[ -n "$DEBV" ] || die "no ruby$V source package downloadable from $SUITE"
UPV=${DEBV#*:} UPV=${UPV%-*}
TARBALLS=("$OUT/src/ruby${V}_${UPV}".orig.tar.*) TARBALL=${TARBALLS[0]}
[ -f "$TARBALL" ] || die "no .orig tarball for ruby$V $DEBV in $OUT/src"

rm -rf "$OUT/build" "$ROOT" "$OUT/.complete" && mkdir -p "$OUT/build"
tar -xf "$TARBALL" -C "$OUT/build" --strip-components=1
start=$(date +%s)
(
  cd "$OUT/build"
  ./configure -q --prefix="$ROOT" "${LINK[@]}" --enable-yjit \
    --disable-install-doc --without-baseruby --without-gmp --disable-dtrace
  make -j"$(nproc)"
  make install
) >"$OUT/build.log" 2>&1 || die "build failed; see the end of $OUT/build.log"
echo "build-ruby-yjit: Ruby $UPV built and installed in $(($(date +%s) - start)) s" >&2
yjit_ok || die "$RUBY does not run with YJIT enabled"
for ext in openssl psych zlib fiddle; do
  "$RUBY" -e "require '$ext'" >/dev/null 2>&1 || echo "build-ruby-yjit: extension $ext was not built (skipped)" >&2
done
"$RUBY" --yjit -e 'puts RUBY_DESCRIPTION' >&2
rm -rf "$OUT/build"
echo "$DEBV rustc $rv" >"$OUT/.complete"
echo "$RUBY"
