#!/usr/bin/env bash
# Build the pinned OpenTelemetry Collector used by the e2e tests (test/e2e).
#
# Usage: utils/collector/build.sh [--force]
#
# - Installs the OpenTelemetry Collector Builder (ocb) v0.159.0 with
#   `go install` into the cache directory (not into $GOPATH/bin).
# - Builds otelcol-e2e from builder-config.yaml into
#     ${OTELCOL_E2E_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ebpf-profiler/otelcol-e2e-v0.159.0}/otelcol-e2e
# - Skips everything when that binary already exists (use --force to rebuild).
# - Progress goes to stderr; the LAST line on stdout is the binary path.
#
# Needs: go (1.25+), access to the Go module proxy on a cold build.
# Cold build (empty Go caches, 2 cores): ~75-80 s; adds ~520 MiB to GOMODCACHE,
# ~660 MiB to GOCACHE, and ~45 MiB to the cache dir (33 MiB collector, 12 MiB
# builder). Later runs find the binary and return at once.
set -euo pipefail

OCB_VERSION=v0.159.0
OCB_MODULE=go.opentelemetry.io/collector/cmd/builder

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
manifest="${script_dir}/builder-config.yaml"

cache_root="${XDG_CACHE_HOME:-${HOME:?HOME or XDG_CACHE_HOME must be set}/.cache}"
out_dir="${OTELCOL_E2E_CACHE_DIR:-${cache_root}/ebpf-profiler/otelcol-e2e-${OCB_VERSION}}"
bin="${out_dir}/otelcol-e2e"

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

log() { echo "build.sh: $*" >&2; }

if [[ $force -eq 0 && -x "$bin" ]]; then
  log "using cached collector (delete it or pass --force to rebuild)"
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { log "go not found in PATH"; exit 1; }
mkdir -p "$out_dir"

# Serialize concurrent builds into the same cache dir.
if command -v flock >/dev/null; then
  exec 9>"${out_dir}/.lock"
  flock 9
  if [[ $force -eq 0 && -x "$bin" ]]; then
    log "collector was built by a concurrent run"
    echo "$bin"
    exit 0
  fi
fi

start=$(date +%s)

# 1. Install the pinned builder into the cache dir.
ocb="${out_dir}/bin/builder"
if [[ ! -x "$ocb" ]] || ! "$ocb" version 2>/dev/null | grep -q "${OCB_VERSION}"; then
  log "installing ${OCB_MODULE}@${OCB_VERSION}"
  GOBIN="${out_dir}/bin" go install "${OCB_MODULE}@${OCB_VERSION}" >&2
fi

# 2. Generate sources + build. The manifest's output_path is rewritten to a
#    staging dir inside the cache; the finished binary is moved into place
#    atomically so an interrupted build never leaves a half-written binary.
src="${out_dir}/src"
rm -rf "$src"
mkdir -p "$src"
gen_manifest="${out_dir}/builder-config.generated.yaml"
sed -E "s|^([[:space:]]*output_path:).*$|\1 ${src}|" "$manifest" >"$gen_manifest"
grep -q "output_path: ${src}\$" "$gen_manifest" || { log "failed to rewrite output_path"; exit 1; }

log "building otelcol-e2e (this takes a few minutes on a cold cache)"
(cd "$out_dir" && CGO_ENABLED=0 "$ocb" --config="$gen_manifest" >&2)

chmod 0755 "${src}/otelcol-e2e"
mv -f "${src}/otelcol-e2e" "$bin"   # same filesystem: atomic rename
log "built in $(( $(date +%s) - start ))s"
echo "$bin"
