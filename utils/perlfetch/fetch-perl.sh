#!/bin/bash
# fetch-perl.sh VERSION [ARCH] - a Debian perl build for the profiler's Perl tests: 5.32, 5.40 or 5.42
# for this machine (Debian 12's own 5.36 is the system's /usr/bin/perl), or 5.32, 5.36, 5.40 or 5.42
# for a foreign ARCH (arm64: the kernel matrix's VMs run it; it is unpacked here, never run).
#
# Downloads perl-base (/usr/bin/perl, with the interpreter linked in), libperl5.XX (libperl.so and
# the XS modules, threads among them) and perl-modules-5.XX from the Debian suite that carries the
# version (5.32: bullseye with its security updates, 5.36: bookworm with them, 5.40: trixie, 5.42:
# sid) with the libraries they link against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/perl-VERSION-ARCH/root/
# trixie's and sid's builds need glibc >= 2.38 (Debian 12 has 2.36): their suite's libc6 is unpacked too and the perl
# executable is pointed at that loader and the unpacked libraries with patchelf (PT_INTERP and
# DT_RPATH), as fetch-ruby.sh does, so the process is the genuine perl executable. A foreign
# architecture's build always gets its own suite's libc that way, so that the tree runs wherever
# it is copied to at the same path. perl5lib in the cache dir holds the unpacked module
# directories, which must come first in PERL5LIB (the executable's compiled-in @INC names /usr),
# and bin/perl is a wrapper that sets it and execs perl. libperl's launcher
# (usr/bin/perl5.XX-TRIPLET, which runs the interpreter from libperl.so) is pointed at the
# unpacked root the same way, and bin/perl-libperl execs it as bin/perl execs perl.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# wrapper's path.
set -euo pipefail

die() { echo "fetch-perl: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 5.32|5.36|5.40|5.42 [amd64|arm64]"
V=$1 HOST=$(dpkg --print-architecture)
export RUNTIME_ARCH=${2:-$HOST}
case $V in
  5.32) SUITE=bullseye SECURITY=1 NEW_LIBC=0 ;;
  5.36) SUITE=bookworm SECURITY=1 NEW_LIBC=0 ;;
  5.40) SUITE=trixie SECURITY=0 NEW_LIBC=1 ;;
  5.42) SUITE=sid SECURITY=0 NEW_LIBC=1 ;;
  *) die "no Debian suite known for perl $V" ;;
esac
FOREIGN=0
if [ "$RUNTIME_ARCH" != "$HOST" ]; then
  # The mirror serves no foreign architecture's security updates.
  FOREIGN=1 NEW_LIBC=1 SECURITY=0
elif [ "$V" = 5.36 ]; then
  die "perl 5.36 is Debian 12's own /usr/bin/perl here"
fi
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
. "$(dirname "$0")/../debfetch/runtime-debs.sh"
OUT=$BASE/perl-$V-$RUNTIME_ARCH
ROOT=$OUT/root WRAPPER=$OUT/bin/perl LIBWRAPPER=$OUT/bin/perl-libperl
LIBDIR=$ROOT/usr/lib/$(runtime_triplet) PERL=$ROOT/usr/bin/perl
LAUNCHER=$ROOT/usr/bin/perl$V-$(runtime_triplet)
check='use threads; use Time::HiRes; exit 0'
runs() { [ "$FOREIGN" = 1 ] || { "$WRAPPER" -e "$check" && "$LIBWRAPPER" -e "$check"; } >/dev/null 2>&1; }
if [ -f "$OUT/.complete" ] && [ -f "$OUT/perl5lib" ] && [ -x "$LIBWRAPPER" ] && runs; then echo "$WRAPPER"; exit 0; fi

# The interpreter packages plus their lib* runtime dependencies; here the host's own libc serves
# bullseye's build (glibc 2.31's libpthread and libdl are stubs in 2.36).
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" perl-base "libperl$V" "perl-modules-$V" ||
  die "unpacking perl $V failed"
[ -x "$PERL" ] || die "$PERL missing after unpacking"
[ -x "$LAUNCHER" ] || die "$LAUNCHER missing after unpacking"
for exe in "$PERL" "$LAUNCHER"; do
  point_at_root "$exe" "$ROOT" "$NEW_LIBC" || die "patchelf $exe failed"
done

# Module directories: perl-base's, libperl's (versioned 5.XX or 5.XX.Y) and perl-modules'.
INC=$LIBDIR/perl-base
for d in "$LIBDIR"/perl/"$V"* "$ROOT"/usr/share/perl/"$V"*; do
  [ -d "$d" ] && [ ! -L "$d" ] && INC=$INC:$d
done
mkdir -p "$(dirname "$WRAPPER")"
echo "$INC" >"$OUT/perl5lib"
for w in "$WRAPPER:$PERL" "$LIBWRAPPER:$LAUNCHER"; do
  cat >"${w%%:*}" <<W
#!/bin/sh
# perl $V from Debian $SUITE with its own modules and libraries (written by fetch-perl.sh).
PERL5LIB='$INC' exec '${w#*:}' "\$@"
W
  chmod +x "${w%%:*}"
done
if [ "$FOREIGN" = 0 ]; then
  for w in "$WRAPPER" "$LIBWRAPPER"; do
    "$w" -e "$check" || die "$w does not run threads"
    "$w" -e 'print "perl $^V\n"' >&2
  done
fi
dpkg-deb -f "$(ls "$OUT"/debs/perl-base_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$WRAPPER"
