#!/bin/bash
# fetch-perl.sh VERSION - a Debian perl build (5.32 or 5.40) for the profiler's Perl tests; Debian
# 12's own 5.36 is the system's /usr/bin/perl.
#
# Downloads perl-base (/usr/bin/perl, with the interpreter linked in), libperl5.XX (libperl.so and
# the XS modules, threads among them) and perl-modules-5.XX from the Debian suite that carries the
# version (5.32: bullseye with its security updates, 5.40: trixie) with the libraries they link
# against, and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/perl-VERSION-amd64/root/
# trixie's build needs glibc >= 2.38 (Debian 12 has 2.36): its libc6 is unpacked too and the perl
# executable is pointed at that loader and the unpacked libraries with patchelf (PT_INTERP and
# DT_RPATH), as fetch-ruby.sh does, so the process is the genuine perl executable. bin/perl in the
# cache dir is a wrapper that puts the unpacked module directories first in PERL5LIB (the
# executable's compiled-in @INC names /usr, where the system's 5.36 modules are) and execs it.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# wrapper's path.
set -euo pipefail

die() { echo "fetch-perl: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 5.32|5.40"
V=$1
case $V in
  5.32) SUITE=bullseye SECURITY=1 NEW_LIBC=0 ;;
  5.40) SUITE=trixie SECURITY=0 NEW_LIBC=1 ;;
  *) die "no Debian suite known for perl $V (5.36 is Debian 12's own /usr/bin/perl)" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is fetched"
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/perl-$V-amd64 ROOT=$BASE/perl-$V-amd64/root WRAPPER=$BASE/perl-$V-amd64/bin/perl
LIBDIR=$ROOT/usr/lib/x86_64-linux-gnu PERL=$ROOT/usr/bin/perl
check='use threads; use Time::HiRes; exit 0'
if [ -f "$OUT/.complete" ] && "$WRAPPER" -e "$check" >/dev/null 2>&1; then echo "$WRAPPER"; exit 0; fi

# The interpreter packages plus their lib* runtime dependencies; the host's own libc serves
# bullseye's build (glibc 2.31's libpthread and libdl are stubs in 2.36).
. "$(dirname "$0")/../debfetch/runtime-debs.sh"
unpack_runtime "$OUT" "$SUITE" "$SECURITY" "$NEW_LIBC" perl-base "libperl$V" "perl-modules-$V" ||
  die "unpacking perl $V failed"
[ -x "$PERL" ] || die "$PERL missing after unpacking"
point_at_root "$PERL" "$ROOT" "$NEW_LIBC" || die "patchelf $PERL failed"

# Module directories: perl-base's, libperl's (versioned 5.XX or 5.XX.Y) and perl-modules'.
INC=$LIBDIR/perl-base
for d in "$LIBDIR"/perl/"$V"* "$ROOT"/usr/share/perl/"$V"*; do
  [ -d "$d" ] && [ ! -L "$d" ] && INC=$INC:$d
done
mkdir -p "$(dirname "$WRAPPER")"
cat >"$WRAPPER" <<W
#!/bin/sh
# perl $V from Debian $SUITE with its own modules and libraries (written by fetch-perl.sh).
PERL5LIB='$INC' exec '$PERL' "\$@"
W
chmod +x "$WRAPPER"
"$WRAPPER" -e "$check" || die "$WRAPPER does not run threads"
"$WRAPPER" -e 'print "perl $^V\n"' >&2
dpkg-deb -f "$(ls "$OUT"/debs/perl-base_*.deb | sort -V | tail -1)" Version >"$OUT/.complete"
echo "$WRAPPER"
