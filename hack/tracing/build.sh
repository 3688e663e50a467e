#!/usr/bin/env bash
# Builds (once) Jaeger v2, the OTLP trace receiver the trace tests run, and
# prints the folder that holds it. Cached outside the clone by version, so
# only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${PETSTORE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator}"
bin_dir="$cache_root/jaeger-$JAEGER_VERSION"
mkdir -p "$bin_dir"

log() { printf '[tracing] %s\n' "$*" >&2; }

# (go.mod calls it indirect: no Go file of this module imports it.)
if ! grep -Eq "^\s*github.com/jaegertracing/jaeger $JAEGER_MODULE_VERSION( |\$)" "$here/go.mod"; then
  log "go.mod does not require github.com/jaegertracing/jaeger $JAEGER_MODULE_VERSION (versions.env); update both together"
  exit 1
fi

if [[ ! -x "$bin_dir/jaeger" ]]; then
  log "building jaeger $JAEGER_VERSION (first run only; this takes several minutes)"
  start=$SECONDS
  # -mod=readonly: go.sum pins every module of the build, so nothing is
  # resolved afresh.
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -ldflags "-s -w -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$JAEGER_VERSION" \
    -o "$bin_dir/jaeger.partial" github.com/jaegertracing/jaeger/cmd/jaeger)
  mv "$bin_dir/jaeger.partial" "$bin_dir/jaeger"
  log "built jaeger in $((SECONDS - start))s"
fi

echo "$bin_dir"
