#!/usr/bin/env bash
# Builds (once) the binaries the end-to-end tests need and prints the folder
# that holds them. Binaries are cached outside the clone, keyed by version, so
# only a missing binary triggers a build.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "kube-$KUBE_VERSION-etcd-$ETCD_VERSION-grpcurl-$GRPCURL_VERSION")

build() { # name, then go build arguments
  local name=$1; shift
  if [[ -x "$bin_dir/$name" ]]; then return; fi
  log "building $name (first run only; this takes several minutes)"
  local start=$SECONDS
  (cd "$here" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -o "$bin_dir/$name.partial" "$@")
  mv "$bin_dir/$name.partial" "$bin_dir/$name"
  log "built $name in $((SECONDS - start))s"
}

minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
build kube-apiserver -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-apiserver
# Only its namespace controller is run: without it a deleted namespace would
# never empty, so namespace deletion could not be tested.
build kube-controller-manager -ldflags "-s -w \
  -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-controller-manager
build etcd -ldflags "-s -w" go.etcd.io/etcd/server/v3

if [[ ! -x "$bin_dir/grpcurl" ]]; then
  log "installing grpcurl $GRPCURL_VERSION"
  GOBIN="$bin_dir" CGO_ENABLED=0 go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
fi

if [[ ! -x "$bin_dir/ghz-$GHZ_VERSION" ]]; then
  log "installing ghz $GHZ_VERSION"
  tmp=$(mktemp -d)
  GOBIN="$tmp" CGO_ENABLED=0 go install "github.com/bojand/ghz/cmd/ghz@$GHZ_VERSION"
  mv "$tmp/ghz" "$bin_dir/ghz-$GHZ_VERSION"
  rmdir "$tmp"
fi
ln -sfn "ghz-$GHZ_VERSION" "$bin_dir/ghz"

# kubectl supports one minor of skew against the API server; build a matching
# one only when the machine's kubectl is further away (or missing).
kubectl_ok() {
  command -v kubectl >/dev/null || return 1
  local v; v=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": *"\([0-9]*\).*/\1/p' | head -n1)
  [[ -n "$v" ]] && (( v >= minor - 1 && v <= minor + 1 ))
}
if ! kubectl_ok; then
  build kubectl k8s.io/kubernetes/cmd/kubectl
fi

echo "$bin_dir"
