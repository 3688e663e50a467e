#!/usr/bin/env bash
# Makes sure the Docker engine has every image the local cluster needs:
#
#  - each base image the Dockerfile names (FROM): used as is when present,
#    pulled when the engine can pull, and otherwise made locally as a
#    stand-in under that exact tag (said on stderr): a debootstrapped
#    bookworm with gcc and the host's Rust toolchain for rust:*-slim-bookworm,
#    and glibc, libgcc, tzdata, CA certificates and the nonroot user for
#    gcr.io/distroless/cc-debian12:nonroot;
#  - the node's own images, FROM scratch around binaries from build.sh:
#    the pause sandbox, CoreDNS, local-path-provisioner and its busybox
#    helper.
#
# Then it saves the node images as tar files for `ctr images import` and
# prints the folder that holds them. Everything is cached outside the clone,
# keyed by version.
#
#   hack/cluster/images.sh BIN_DIR      (BIN_DIR: what build.sh printed)
#   hack/cluster/images.sh --base-only  (only the Dockerfile's base images)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
bin_dir=${1:?usage: images.sh BIN_DIR | --base-only}
docker=${DOCKER:-docker}
cache_root="${PETSTORE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator}"
log() { printf '[images] %s\n' "$*" >&2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

have() { "$docker" image inspect "$1" >/dev/null 2>&1; }

# A minimal bookworm root, made once and kept as a tar.
bookworm_tar() {
  local tar="$cache_root/standins/bookworm-minbase-$1.tar"
  if [[ ! -f "$tar" ]]; then
    command -v debootstrap >/dev/null || { log "stand-ins need debootstrap (apt-get install debootstrap)"; exit 1; }
    mkdir -p "$cache_root/standins"
    log "debootstrapping bookworm (minbase, with: $1)"
    local dir="$work/rootfs-$1"
    debootstrap --variant=minbase --include="$1" bookworm "$dir" >"$work/debootstrap.log" 2>&1 \
      || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$tar.partial" .
    rm -rf "$dir"
    mv "$tar.partial" "$tar"
  fi
  echo "$tar"
}

standin_rust() { # tag, e.g. rust:1.95-slim-bookworm
  local tag=$1 want=${1#rust:}; want=${want%%-*}
  local host; host=$(rustc --version | awk '{print $2}')
  if [[ "$host" != "$want" && "$host" != "$want".* ]]; then
    log "warning: the host's Rust is $host, the stand-in for $tag gets that toolchain"
  fi
  local sysroot; sysroot=$(rustc --print sysroot)
  local dir="$work/rust"
  mkdir -p "$dir"
  tar -C "$dir" -xf "$(bookworm_tar gcc,libc6-dev,ca-certificates)"
  # The host's trusted CAs: downloads made inside the build (cargo fetch)
  # pass through the same network as the host's.
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$dir/usr/local/rust" "$dir/usr/local/cargo/bin" "$dir/usr/local/rustup"
  cp -a "$sysroot/bin" "$sysroot/lib" "$dir/usr/local/rust/"
  rm -rf "$dir/usr/local/rust/lib/rustlib/src"
  tar -C "$dir" -c . | "$docker" import \
    --change 'ENV RUSTUP_HOME=/usr/local/rustup' \
    --change 'ENV CARGO_HOME=/usr/local/cargo' \
    --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change "ENV RUST_VERSION=$host" \
    - "$tag" >/dev/null
  rm -rf "$dir"
}

standin_distroless_cc() { # tag
  local tag=$1
  local dir="$work/distroless" debs="$work/debs"
  mkdir -p "$dir" "$debs"
  (cd "$debs" && apt-get download -q libc6 libgcc-s1 tzdata netbase base-files >/dev/null 2>"$work/apt.log") \
    || { cat "$work/apt.log" >&2; exit 1; }
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dir"; done
  mkdir -p "$dir/etc/ssl/certs" "$dir/home/nonroot" "$dir/tmp"
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
  chmod 1777 "$dir/tmp"
  chown 65532:65532 "$dir/home/nonroot"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$dir/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$dir/etc/group"
  tar -C "$dir" -c . | "$docker" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'USER 65532' --change 'WORKDIR /home/nonroot' \
    - "$tag" >/dev/null
  rm -rf "$dir" "$debs"
}

# The Dockerfile's base images, with its ARG defaults filled in.
base_images() {
  awk '
    toupper($1) == "ARG" { split($2, kv, "="); if (kv[2] != "") arg[kv[1]] = kv[2] }
    toupper($1) == "FROM" {
      image = $2
      for (k in arg) { gsub("\\$\\{" k "\\}", arg[k], image); gsub("\\$" k, arg[k], image) }
      if (image != "scratch") print image
    }' "$root/Dockerfile" | sort -u
}
stages=$(awk 'toupper($1) == "FROM" && toupper($3) == "AS" { print $4 }' "$root/Dockerfile")
for image in $(base_images); do
  grep -qx "$image" <<<"$stages" && continue
  have "$image" && continue
  if "$docker" pull -q "$image" >/dev/null 2>&1; then
    log "pulled $image"
    continue
  fi
  case "$image" in
    rust:*-slim-bookworm) standin_rust "$image" ;;
    gcr.io/distroless/cc-debian12:nonroot) standin_distroless_cc "$image" ;;
    *) log "cannot pull $image and have no stand-in recipe for it"; exit 1 ;;
  esac
  log "$image cannot be pulled here: made a local stand-in under that tag"
done

[[ $bin_dir == --base-only ]] && exit 0

# The node's images, saved for ctr.
out="$cache_root/node-images-coredns-$COREDNS_VERSION-lpp-$LOCAL_PATH_PROVISIONER_VERSION-${PAUSE_IMAGE##*:}"
mkdir -p "$out"
# FROM scratch plus files needs no BuildKit; the legacy builder works with
# any client (its deprecation notice is dropped unless the build fails).
legacy_build() { # tag, context
  DOCKER_BUILDKIT=0 "$docker" build -q -t "$1" "$2" >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; exit 1; }
}
scratch_image() { # tag, file in the image, then files to copy (name=source)
  local tag=$1 name=$2; shift 2
  local tar="$out/$name.tar"
  [[ -f "$tar" ]] && return
  local ctx="$work/$name"
  mkdir -p "$ctx"
  { echo "FROM scratch"; } > "$ctx/Dockerfile"
  local entry
  for spec in "$@"; do
    local dest=${spec%%=*} src=${spec#*=}
    mkdir -p "$ctx/files$(dirname "$dest")"
    cp -L "$src" "$ctx/files$dest"
  done
  echo "COPY files/ /" >> "$ctx/Dockerfile"
  entry=${1%%=*}
  echo "ENTRYPOINT [\"$entry\"]" >> "$ctx/Dockerfile"
  legacy_build "$tag" "$ctx"
  "$docker" save "$tag" -o "$tar.partial"
  mv "$tar.partial" "$tar"
  rm -rf "$ctx"
}
scratch_image "$PAUSE_IMAGE" pause /pause="$bin_dir/pause"
scratch_image "petstore.local/coredns:$COREDNS_VERSION" coredns /coredns="$bin_dir/coredns"
scratch_image "petstore.local/local-path-provisioner:$LOCAL_PATH_PROVISIONER_VERSION" local-path-provisioner \
  /local-path-provisioner="$bin_dir/local-path-provisioner"
# local-path-provisioner's helper pods run `sh -c 'mkdir ...'`: a static
# busybox (Debian's busybox-static) is all they need.
if [[ ! -f "$out/busybox.tar" ]]; then
  busybox=$(command -v busybox || true)
  if [[ -z "$busybox" ]] || ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
    [[ -x /bin/busybox ]] && file -L /bin/busybox | grep -q 'statically linked' && busybox=/bin/busybox
  fi
  [[ -n "$busybox" ]] || { log "the helper image needs a static busybox (apt-get install busybox-static)"; exit 1; }
  ctx="$work/busybox"; mkdir -p "$ctx/files/bin"
  cp -L "$busybox" "$ctx/files/bin/busybox"
  for applet in sh mkdir rm rmdir ls chmod cat; do ln -s busybox "$ctx/files/bin/$applet"; done
  printf 'FROM scratch\nCOPY files/ /\nENV PATH=/bin\nENTRYPOINT ["/bin/sh"]\n' > "$ctx/Dockerfile"
  legacy_build petstore.local/busybox:static "$ctx"
  "$docker" save petstore.local/busybox:static -o "$out/busybox.tar.partial"
  mv "$out/busybox.tar.partial" "$out/busybox.tar"
fi
echo "$out"
