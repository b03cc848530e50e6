#!/usr/bin/env bash
# lines.sh OUTDIR [daemon flags...]: runs ./ebpf-profiler at 100 Hz for 45 s
# beside five busy processes (the C++ workload built with -g, a stripped Go
# binary with an inlined call, CPython, Node, gzip) and prints its status
# line's debuginfo, native_frames and rss_mib fields: how many native
# frames got names, lines and inlined frames, and what that cost.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
shift
rm -rf "$out" && mkdir -p "$out"
g++ -O2 -g -o "$out/cppchain" utils/workloads/cppchain.cpp
go build -ldflags='-s -w' -o "$out/goinline" ./utils/workloads/goinline
./ebpf-profiler -output-dir "$out" -monitor-interval 40s -samples-per-second 100 "$@" >"$out/daemon.log" 2>&1 &
daemon=$!
sleep 3
"$out/cppchain" 38 >/dev/null &
"$out/goinline" 38 >/dev/null &
timeout 38 python3 -c 'while True: sum(i * i for i in range(10000))' &
timeout 38 node -e 'let s = 0; for (;;) { for (let i = 0; i < 1e6; i++) s += i * i % 7 }' &
timeout 38 sh -c 'while :; do head -c 20000000 /dev/urandom | gzip -c >/dev/null; done' &
sleep 45
kill -INT "$daemon"
wait "$daemon" || true
grep -o 'debuginfo="[^"]*"\|native_frames="[^"]*"\|rss_mib=[^ ]*' "$out/daemon.log" | head -3
