#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian 12 machine (as root):
# the pinned BPF compiler, gcc/g++ and binutils for the workloads and the
# unwind-table checks, arm64 libc and libgcc (parsed, not run), bpftool,
# and the OpenTelemetry Collector the end-to-end tests export to.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(clang-16 clang-format-16 llvm-16 gcc g++ binutils make bpftool libc6-arm64-cross libgcc-s1-arm64-cross)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "Installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Builds the collector once and caches it; prints its path.
./utils/collector/build.sh
