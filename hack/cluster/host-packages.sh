#!/usr/bin/env bash
# Installs the Debian packages the local one-node cluster needs, when
# missing: containerd (the node's CRI runtime), runc, the CNI plugins,
# iptables and conntrack for kube-proxy, debootstrap for stand-in base
# images, and a static busybox for local-path-provisioner's helper pods.
# With --engine (no Docker engine answers), also Debian's docker.io.
set -euo pipefail
want=()
need() { # command or file, package
  if [[ $1 == /* ]]; then [[ -e $1 ]] || want+=("$2"); else command -v "$1" >/dev/null || want+=("$2"); fi
}
need containerd containerd
need ctr containerd
need runc runc
need /usr/lib/cni/bridge containernetworking-plugins
need iptables iptables
need conntrack conntrack
need nsenter util-linux
need debootstrap debootstrap
need /bin/busybox busybox-static
file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' || want+=(busybox-static)
if [[ ${1:-} == --engine ]]; then
  need dockerd docker.io
  need docker docker.io
fi
if ((${#want[@]})); then
  mapfile -t want < <(printf '%s\n' "${want[@]}" | sort -u)
  echo "[host-packages] installing ${want[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
fi
