#!/usr/bin/env bash
# Builds kubectl-petstore for linux/arm64 beside this machine's linux/amd64
# build, so that the krew release step packs an archive for each platform.
# Installs what it needs when missing: Rust's standard library for the
# target (rustup), and Debian's cross C compiler and arm64 C library (ring,
# the TLS crates' crypto, compiles C) and qemu-user (the test runs the
# arm64 binary under emulation). Cargo's target directory caches the build
# like the host's; the linker is set in .cargo/config.toml.
#
#   PROFILE   cargo profile (default dev, as the tests use)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
target=aarch64-unknown-linux-gnu

if command -v rustup >/dev/null; then
  rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
elif [[ ! -d "$(rustc --print sysroot)/lib/rustlib/$target" ]]; then
  echo "no Rust standard library for $target, and no rustup to add it" >&2
  exit 1
fi
want=()
command -v aarch64-linux-gnu-gcc >/dev/null || want+=(gcc-aarch64-linux-gnu)
[[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]] || want+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || want+=(qemu-user)
if ((${#want[@]})); then
  if [[ $EUID -ne 0 ]]; then
    echo "cross-building for $target needs ${want[*]} (Debian: apt-get install ${want[*]})" >&2
    exit 1
  fi
  echo "[cross] installing ${want[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
fi
exec cargo build --locked --target "$target" --profile "${PROFILE:-dev}" \
  -p petstore-operator --bin kubectl-petstore
