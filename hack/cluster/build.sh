#!/usr/bin/env bash
# Builds (once) what the local one-node cluster needs and prints the folder
# that holds it: kubelet, kube-scheduler and kube-proxy (from the same wrapper
# go.mod as the control plane), Tilt, the registry, CoreDNS,
# local-path-provisioner and a static pause binary. Cached outside the clone,
# keyed by version, like hack/control-plane/build.sh.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../control-plane/versions.env
source "$here/../control-plane/versions.env"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

bin_dir=$(tool_dir "cluster-kube-$KUBE_VERSION-tilt-$TILT_VERSION-registry-$REGISTRY_VERSION-coredns-$COREDNS_VERSION-lpp-$LOCAL_PATH_PROVISIONER_VERSION")

work=$(mktemp -d)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT

# The Kubernetes node binaries. The wrapper module is copied so that
# -mod=mod never rewrites the clone's go.mod or go.sum.
minor=${KUBE_VERSION#v1.}; minor=${minor%%.*}
kube_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
  -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
mkdir -p "$work/kube"
cp "$here/../control-plane/go.mod" "$here/../control-plane/go.sum" "$work/kube/"
for name in kube-scheduler kubelet kube-proxy; do
  [[ -x "$bin_dir/$name" ]] && continue
  log "building $name $KUBE_VERSION (first run only)"
  start=$SECONDS
  (cd "$work/kube" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" \
    go build -trimpath -ldflags "$kube_ldflags" -o "$bin_dir/$name.partial" "k8s.io/kubernetes/cmd/$name")
  mv "$bin_dir/$name.partial" "$bin_dir/$name"
  log "built $name in $((SECONDS - start))s"
done

go_install() { # binary name, module path@version
  local name=$1 pkg=$2
  [[ -x "$bin_dir/$name" ]] && return
  log "installing $pkg (first run only)"
  local start=$SECONDS
  mkdir -p "$work/gobin"
  GOBIN="$work/gobin" CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -trimpath -ldflags "-s -w" "$pkg"
  mv "$work/gobin/$(basename "${pkg%@*}")" "$bin_dir/$name"
  log "installed $name in $((SECONDS - start))s"
}
go_install registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
go_install coredns "github.com/coredns/coredns@$COREDNS_VERSION"
go_install local-path-provisioner "github.com/rancher/local-path-provisioner@$LOCAL_PATH_PROVISIONER_VERSION"

# Tilt: the proxy serves its module but not its version list, and the
# checksum database has no entry, so `go install` is refused. Its module zip
# carries vendor/modules.txt without the code, so vendor/ goes. Without its
# web assets a source build runs as a development build and `tilt ci` stops
# at "Could not find Tilt web static files"; a placeholder page and the
# release version stamp make it a release build (the web UI shows only the
# placeholder). tree-sitter needs cgo.
if [[ ! -x "$bin_dir/tilt" ]]; then
  log "building tilt $TILT_VERSION (first run only; about 9 minutes on 2 cores)"
  start=$SECONDS
  dir=$(cd "$work" && GONOSUMDB='github.com/tilt-dev/*' GOFLAGS=-mod=mod \
    go mod download -json "github.com/tilt-dev/tilt@$TILT_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -d "$dir" ]] || { log "cannot download github.com/tilt-dev/tilt@$TILT_VERSION"; exit 1; }
  cp -r "$dir" "$work/tilt"
  chmod -R u+w "$work/tilt"
  rm -rf "$work/tilt/vendor"
  mkdir -p "$work/tilt/pkg/assets/build"
  echo '<!doctype html><title>Tilt</title><p>Tilt built from source: no web UI.</p>' \
    > "$work/tilt/pkg/assets/build/index.html"
  (cd "$work/tilt" && CGO_ENABLED=1 GONOSUMDB='github.com/tilt-dev/*' GOFLAGS="-mod=mod -buildvcs=false" \
    go build -trimpath -ldflags "-s -w -X main.version=${TILT_VERSION#v}" -o "$bin_dir/tilt.partial" ./cmd/tilt)
  mv "$bin_dir/tilt.partial" "$bin_dir/tilt"
  log "built tilt in $((SECONDS - start))s"
fi

if [[ ! -x "$bin_dir/pause" ]]; then
  gcc -static -O2 -o "$bin_dir/pause.partial" "$here/pause.c"
  mv "$bin_dir/pause.partial" "$bin_dir/pause"
fi

echo "$bin_dir"
