#!/usr/bin/env bash
# Builds (once) the OTLP trace receiver the trace tests run (an OpenTelemetry
# Collector with only the OTLP receiver and the file exporter, main.go) and
# prints the folder that holds it. Cached outside the clone by version, so
# only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "otelcol-traces-$OTELCOL_VERSION")

for module in go.opentelemetry.io/collector/otelcol \
  go.opentelemetry.io/collector/receiver/otlpreceiver \
  github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter; do
  if ! grep -Eq "^\s*$module $OTELCOL_VERSION( |\$)" "$here/go.mod"; then
    log "go.mod does not require $module $OTELCOL_VERSION (versions.env); update both together"
    exit 1
  fi
done

if [[ ! -x "$bin_dir/otelcol-traces" ]]; then
  log "building otelcol-traces $OTELCOL_VERSION (first run only; this takes a minute or two)"
  start=$SECONDS
  # -mod=readonly: go.sum pins every module of the build, so nothing is
  # resolved afresh.
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -ldflags "-s -w -X main.version=$OTELCOL_VERSION" \
    -o "$bin_dir/otelcol-traces.partial" .)
  mv "$bin_dir/otelcol-traces.partial" "$bin_dir/otelcol-traces"
  log "built otelcol-traces in $((SECONDS - start))s"
fi

echo "$bin_dir"
