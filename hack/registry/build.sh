#!/usr/bin/env bash
# Builds (once) the distribution registry from its Go module and prints the
# folder that holds it: the OCI registry the chart tests push to and pull
# from (tests/e2e/oci.rs). Cached outside the clone, keyed by version, like
# hack/helm/build.sh. REGISTRY_VERSION is the one the local cluster runs
# (hack/cluster/versions.env), so both use the same registry.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../cluster/versions.env
source "$here/../cluster/versions.env"
# hack/lib.sh sources this folder's versions.env, which only points here.
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "registry-$REGISTRY_VERSION")
go_install_once "$bin_dir" registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" \
  -ldflags "-s -w"

echo "$bin_dir"
