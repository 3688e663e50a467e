#!/usr/bin/env bash
# Builds (once) `health` (kstatus, Argo CD's Lua health checks on gopher-lua,
# Flux's CEL health expressions on cel-go: main.go), and prints
# the folder that holds it. Cached outside the clone, keyed by its versions
# and a hash of its source, so only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

for pin in "sigs.k8s.io/cli-utils $CLI_UTILS_VERSION" "k8s.io/apimachinery $APIMACHINERY_VERSION"; do
  if ! grep -Eq "^\s*$pin( |\$)" "$here/go.mod"; then
    log "go.mod does not require $pin (versions.env); update both together"
    exit 1
  fi
done

source_hash=$(cat "$here/go.mod" "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-12)
bin_dir=$(tool_dir "health-$CLI_UTILS_VERSION-$source_hash")

if [[ ! -x "$bin_dir/health" ]]; then
  log "building health (kstatus $CLI_UTILS_VERSION; first run only)"
  start=$SECONDS
  # The control plane's flags, so its build cache serves the packages both
  # compile; -mod=readonly: go.sum pins every module.
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -o "$bin_dir/health.partial" .)
  mv "$bin_dir/health.partial" "$bin_dir/health"
  log "built health in $((SECONDS - start))s"
fi

echo "$bin_dir"
