#!/usr/bin/env bash
# Fetches a Debian kernel image for the kernel matrix (issue 8) and prints
# the path of its vmlinuz (the package it came from is in $path.package). Usage: fetch-kernel.sh ARCH SERIES
#   ARCH    amd64 or arm64
#   SERIES  5.10 (bullseye), 6.1 (bookworm), 6.12 (bookworm), 7.2 (sid)
# The newest package of the series that the mirror actually serves is used
# (its index lists some files it answers with 404). Kernels are cached in
# $KERNEL_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/ebpf-profiler/kernels,
# where the other fetch scripts cache too): a cached series
# needs no network. Apt runs with a private configuration under the cache,
# so the system's sources and architectures are left alone. Needs root.
set -euo pipefail

arch=${1:?usage: fetch-kernel.sh ARCH SERIES}
series=${2:?usage: fetch-kernel.sh ARCH SERIES}
cache=${KERNEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler/kernels}

# Which packages hold a series' kernel: the cloud flavour (small, and has
# everything the tests need built in). From 7.x on, sid ships the image in
# linux-binary-* packages.
case "$series" in
  5.10) pattern="^linux-image-5\.10\.0-[0-9]+-cloud-$arch(-unsigned)?\$" ;;
  6.1) pattern="^linux-image-6\.1\.0-[0-9]+-cloud-$arch(-unsigned)?\$" ;;
  6.12) pattern="^linux-image-6\.12\.[0-9]+\+deb12-cloud-$arch(-unsigned)?\$" ;;
  7.2) pattern="^linux-binary-7\.2\.[0-9]+\+deb14-cloud-$arch\$" ;;
  *) echo "fetch-kernel.sh: unknown series $series (want 5.10, 6.1, 6.12 or 7.2)" >&2; exit 2 ;;
esac
case "$arch" in
  amd64 | arm64) ;;
  *) echo "fetch-kernel.sh: unknown architecture $arch (want amd64 or arm64)" >&2; exit 2 ;;
esac

out="$cache/vmlinuz-$series-$arch"
if [[ -s "$out" ]]; then
  echo "$out"
  exit 0
fi

# A private apt configuration for arch, using the mirrors the system is
# configured with.
apt_dir="$cache/apt-$arch"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$cache/debs"
targets=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)')
mirror=$(awk '$2 !~ /-/ {print $1; exit}' <<<"$targets")
security=$(awk '$2 ~ /-security$/ {print $1; exit}' <<<"$targets")
if [[ -z "$mirror" || -z "$security" ]]; then
  echo "fetch-kernel.sh: no Debian mirror and security mirror in the system's apt sources" >&2
  exit 1
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
{
  for suite in bullseye bookworm sid; do
    echo "deb [arch=$arch signed-by=$keyring] ${mirror%/} $suite main"
  done
  for suite in bullseye-security bookworm-security; do
    echo "deb [arch=$arch signed-by=$keyring] ${security%/} $suite main"
  done
} >"$apt_dir/sources.list"
cat >"$apt_dir/apt.conf" <<CONF
Dir::Etc::sourcelist "$apt_dir/sources.list";
Dir::Etc::sourceparts "-";
Dir::State::Lists "$apt_dir/lists";
Dir::Cache "$apt_dir/cache";
Dir::State::status "/dev/null";
APT::Architecture "$arch";
APT::Architectures { "$arch"; };
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled "false";
Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled "false";
CONF
export APT_CONFIG="$apt_dir/apt.conf"
# The lists are refreshed at most once a day.
if [[ -z "$(find "$apt_dir/lists" -maxdepth 1 -name '*Packages*' -mtime -1 -print -quit)" ]]; then
  apt-get update -qq >&2
fi

deb=""
for pkg in $(apt-cache pkgnames | grep -E "$pattern" | sort -rV); do
  if (cd "$cache/debs" && apt-get download -qq "$pkg" >/dev/null 2>&1); then
    deb=$(ls -t "$cache/debs/${pkg}_"*"_$arch.deb" | head -1)
    break
  fi
  echo "fetch-kernel.sh: $pkg is listed but not served; trying an older one" >&2
done
if [[ -z "$deb" ]]; then
  echo "fetch-kernel.sh: no package matching $pattern could be downloaded" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' './usr/lib/modules/*/vmlinuz' 2>/dev/null || true
image=$(find "$tmp" -name 'vmlinuz*' -type f | head -1)
if [[ -z "$image" ]]; then
  echo "fetch-kernel.sh: $deb holds no vmlinuz" >&2
  exit 1
fi
# The package's name records which release of the series this is.
basename "$deb" .deb >"$out.package"
cp "$image" "$out.tmp" && mv "$out.tmp" "$out"
echo "fetched $(basename "$deb")" >&2
echo "$out"
