#!/bin/bash
# fetch-go.sh VERSION - a Debian Go toolchain for the profiler's Go tests (goroutine labels): 1.19
# (bookworm), 1.21, 1.22 or 1.23 (bookworm-backports), 1.24 (trixie), 1.25 (trixie-backports) or 1.27
# (sid). The machine's
# own Go (1.26, /usr/local/go) is the other. Tests build their Go programs with each, for amd64 and,
# cross-compiled, arm64: the Go runtime's struct offsets that BPF reads change between releases.
#
# Downloads golang-VERSION-go (the go command, compiler, linker) and golang-VERSION-src (the standard
# library's source, which builds compile) and unpacks them with dpkg-deb -x into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/go-VERSION/
# whose usr/lib/go-VERSION is the GOROOT. The go command and the compiler are Go programs; cgo is not
# used by the tests' builds (CGO_ENABLED=0), so no C library of the suite is needed.
# apt runs under a private APT_CONFIG kept in the cache dir; /etc/apt and dpkg's state are
# untouched. Idempotent: a finished cache dir is reused without network. Last line of stdout: the
# go command's path.
set -euo pipefail

die() { echo "fetch-go: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 1.19|1.21|1.22|1.23|1.24|1.25|1.27"
V=$1
case $V in
  1.19) SUITE=bookworm ;;
  1.21 | 1.22 | 1.23) SUITE=bookworm-backports ;;
  1.24) SUITE=trixie ;;
  1.25) SUITE=trixie-backports ;;
  1.27) SUITE=sid ;;
  *) die "no Debian suite known for Go $V" ;;
esac
BASE=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler
OUT=$BASE/go-$V
GO=$OUT/usr/lib/go-$V/bin/go
runs() { [ "$(GOTOOLCHAIN=local GOROOT="$OUT/usr/lib/go-$V" "$GO" env GOVERSION)" = "go$V" ] ||
  GOTOOLCHAIN=local GOROOT="$OUT/usr/lib/go-$V" "$GO" env GOVERSION | grep -q "^go$V\."; }
if [ -f "$OUT/.complete" ] && runs 2>/dev/null; then echo "$GO"; exit 0; fi

. "$(dirname "$0")/../debfetch/private-apt.sh"
private_apt "$BASE/apt-go-$SUITE-amd64" amd64 "$SUITE" || die "no apt lists for $SUITE"
rm -rf "$OUT" && mkdir -p "$OUT/debs"
(cd "$OUT/debs" && apt-get -q download "golang-$V-go" "golang-$V-src" >&2) ||
  die "downloading golang-$V-go and golang-$V-src from $SUITE failed"
for d in "$OUT"/debs/*.deb; do dpkg-deb -x "$d" "$OUT"; done
rm -rf "$OUT/debs"
runs || die "the unpacked go $V does not run"
echo "$V" >"$OUT/.complete"
echo "$GO"
