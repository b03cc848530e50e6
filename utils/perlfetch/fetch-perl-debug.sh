#!/bin/bash
# fetch-perl-debug.sh VERSION [ARCH] - Debian's perl-debug for a tested perl (5.32, 5.36, 5.40 or 5.42): the
# detached DWARF of perl-base's build, whose struct layouts interpreter/perl's offset tables are
# checked against (TestLayoutFromDWARF).
#
# perl-debug depends on the exact perl it was built with, so it is never installed: it is
# downloaded from its suite (5.32: bullseye, 5.36: bookworm, both with their security updates;
# 5.40: trixie; 5.42: sid) and unpacked with dpkg-deb -x; only the dwz files, which hold the types every
# object of the build shares, are kept in
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/perl-debug-VERSION-ARCH/
# (ARCH: this machine's by default, or arm64).
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# directory.
set -euo pipefail

die() { echo "fetch-perl-debug: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 5.32|5.36|5.40|5.42 [amd64|arm64]"
V=$1 ARCH=${2:-$(dpkg --print-architecture)}
case $V in
  5.32) SUITE=bullseye SECURITY=1 ;;
  5.36) SUITE=bookworm SECURITY=1 ;;
  5.40) SUITE=trixie SECURITY=0 ;;
  5.42) SUITE=sid SECURITY=0 ;;
  *) die "no Debian suite known for perl $V" ;;
esac
case $ARCH in
  amd64) TRIPLET=x86_64-linux-gnu ;;
  # The mirror serves no foreign architecture's security updates: the
  # suite's own build, as fetch-perl.sh unpacks.
  arm64) TRIPLET=aarch64-linux-gnu SECURITY=0 ;;
  *) die "unknown architecture $ARCH" ;;
esac
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/perl-debug-$V-$ARCH
if [ -f "$OUT/.complete" ]; then echo "$OUT"; exit 0; fi

. "$(dirname "$0")/../debfetch/private-apt.sh"
MIRROR=$(debian_mirror) || die "no Debian mirror"
security=""
[ "$SECURITY" = 1 ] && security="${MIRROR%/debian}/debian-security"
private_apt "$BASE/apt-perl-$SUITE-$ARCH" "$ARCH" "$SUITE" $security || die "no apt lists for $SUITE"

rm -rf "$OUT" && mkdir -p "$OUT/deb" "$OUT/x"
(cd "$OUT/deb" && apt-get -q download perl-debug >&2) || die "downloading perl-debug failed"
DEB=$(ls "$OUT"/deb/perl-debug_*.deb)
dpkg-deb -x "$DEB" "$OUT/x"
DWZ=$OUT/x/usr/lib/debug/.dwz/$TRIPLET
[ -f "$DWZ/perl-base.debug" ] || die "no dwz file of perl-base in $DEB"
cp "$DWZ"/*.debug "$OUT/"
rm -rf "$OUT/x" "$OUT/deb"
dpkg-deb -f "$DEB" Version >"$OUT/.complete" 2>/dev/null || basename "$DEB" >"$OUT/.complete"
echo "$OUT"
