#!/usr/bin/env bash
# Builds (once) helm from its Go module and prints the folder that holds it.
# Cached outside the clone, keyed by version, like hack/monitoring/build.sh,
# so only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "helm-$HELM_VERSION")

if [[ ! -x "$bin_dir/helm" ]]; then
  # The ldflags of helm's own Makefile: the version stamp makes `helm
  # version` truthful, and the Kubernetes version (its client-go's, major
  # + 1) is what `helm template` and `helm lint` assume for
  # .Capabilities.KubeVersion and for deprecated APIs, instead of the
  # built-in v1.20.
  helm_mod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",\?$/\1/p')
  client_go=$(sed -n 's/^\s*k8s\.io\/client-go v\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p' "$helm_mod")
  if [[ -z $client_go ]]; then
    log "no k8s.io/client-go in helm's go.mod ($helm_mod)"
    exit 1
  fi
  read -r kube_major kube_minor <<<"$client_go"
  kube_major=$((kube_major + 1))
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata="
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=$kube_major -X $pkg.k8sVersionMinor=$kube_minor"
  done
  go_install_once "$bin_dir" helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" -ldflags "$ldflags"
fi

echo "$bin_dir"
