#!/usr/bin/env bash
# Builds (once) krew from its Go module and prints the folder that holds it,
# as `kubectl-krew`: the name kubectl's plugin lookup finds on PATH, so the
# tests run `kubectl krew ...` as users do. Cached outside the clone, keyed
# by version, like hack/helm/build.sh, so only a missing binary triggers a
# build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "krew-$KREW_VERSION")

# The flags of krew's own hack/make-binaries.sh, with the version for
# `git describe` (a module has no .git), so `kubectl krew version` is
# truthful. A release build sometimes asks GitHub for a newer release: the
# tests set KREW_NO_UPGRADE_CHECK.
go_install_once "$bin_dir" kubectl-krew "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION" -tags netgo \
  -ldflags "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=$KREW_VERSION"

echo "$bin_dir"
