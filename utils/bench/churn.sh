#!/usr/bin/env bash
# Measures the daemon's memory under process churn: it runs ./ebpf-profiler
# (build it with make build) at 100 Hz while a shell loop starts short
# processes (eight binaries, each spinning 2 ms of CPU) as fast as it can
# for SECONDS, and prints the daemon's RSS every 10 s and its heap profile's
# top entries at the end. Usage (root): utils/bench/churn.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-300}
work=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null || true; rm -rf "$work"' EXIT
for i in 0 1 2 3 4 5 6 7; do
  gcc -O2 -fomit-frame-pointer -DHOT="storm_hot_$i" -o "$work/storm_$i" utils/workloads/storm.c
done
./ebpf-profiler -output-dir "$work/pprof" -samples-per-second 100 -pprof 127.0.0.1:6061 >"$work/daemon.log" 2>&1 &
daemon=$!
sleep 2
(
  end=$((SECONDS + seconds)) n=0
  while ((SECONDS < end)); do
    for i in 0 1 2 3 4 5 6 7; do "$work/storm_$i" 2; n=$((n + 1)); done
  done
  echo "$n processes in $seconds s"
) &
churn=$!
for ((t = 10; t <= seconds; t += 10)); do
  sleep 10
  echo "${t}s RSS $(awk '/VmRSS/ {print $2, $3}' "/proc/$daemon/status")"
done
wait "$churn"
curl -s http://127.0.0.1:6061/debug/pprof/heap >"$work/heap.pb.gz"
go tool pprof -top -inuse_space "$work/heap.pb.gz" 2>/dev/null | sed -n '5,15p'
