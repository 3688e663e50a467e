#!/usr/bin/env bash
# Builds (once) promtool from Prometheus's Go module and prints the folder
# that holds it. Cached outside the clone, keyed by version, like
# hack/control-plane/build.sh, so only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "promtool-$PROMETHEUS_MODULE_VERSION")

# The version stamp makes `promtool --version` truthful. remove_all_sd is
# Prometheus's own build tag that leaves out the service discovery plugins
# (AWS, Azure, GCE, ...): `test rules` and `check metrics` need none, and it
# builds cold in well under half the time.
go_install_once "$bin_dir" promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION" \
  -tags remove_all_sd -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION"

echo "$bin_dir"
