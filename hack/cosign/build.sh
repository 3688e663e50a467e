#!/usr/bin/env bash
# Builds (once) cosign from its Go module and prints the folder that holds
# it. Cached outside the clone, keyed by version, like hack/helm/build.sh.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "cosign-$COSIGN_VERSION")
# The version stamp of cosign's own Makefile, so `cosign version` is truthful.
go_install_once "$bin_dir" cosign "github.com/sigstore/cosign/v2/cmd/cosign@$COSIGN_VERSION" \
  -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION"

echo "$bin_dir"
