#!/usr/bin/env bash
# Builds kubectl-petstore for linux/arm64 and windows/amd64 beside this
# machine's linux/amd64 build, so that the krew release step packs an
# archive for each platform. Installs what it needs when missing: Rust's
# standard library for each target (rustup), and Debian's cross C compilers
# and C libraries (ring, the TLS crates' crypto, compiles C), qemu-user and
# Wine (the krew story runs each foreign binary: arm64 under emulation, the
# Windows one under Wine). Cargo's target directory caches the builds like
# the host's; the arm64 linker is set in .cargo/config.toml, and rustc links
# windows-gnu with MinGW's gcc by default.
#
#   PROFILE   cargo profile (default dev, as the tests use)
#   TARGETS   the Rust targets (default both)
#
# macOS is not built: its binary links Apple's Security and CoreFoundation
# frameworks (kube's TLS reads the system's roots), whose SDK Debian does
# not have and no one may redistribute.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
read -r -a targets <<<"${TARGETS:-aarch64-unknown-linux-gnu x86_64-pc-windows-gnu}"

want=()
need() { # command-or-file, Debian package
  if [[ $1 == /* ]]; then [[ -e $1 ]] || want+=("$2"); else command -v "$1" >/dev/null || want+=("$2"); fi
}
for target in "${targets[@]}"; do
  if command -v rustup >/dev/null; then
    rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2
  elif [[ ! -d "$(rustc --print sysroot)/lib/rustlib/$target" ]]; then
    echo "no Rust standard library for $target, and no rustup to add it" >&2
    exit 1
  fi
  case $target in
    aarch64-unknown-linux-gnu)
      need aarch64-linux-gnu-gcc gcc-aarch64-linux-gnu
      need /usr/aarch64-linux-gnu/lib/libc.so.6 libc6-dev-arm64-cross
      need qemu-aarch64 qemu-user
      ;;
    x86_64-pc-windows-gnu)
      need x86_64-w64-mingw32-gcc gcc-mingw-w64-x86-64
      need wine wine64
      ;;
    *)
      echo "hack/cross/build.sh knows no C toolchain for $target" >&2
      exit 1
      ;;
  esac
done
if ((${#want[@]})); then
  if [[ $EUID -ne 0 ]]; then
    echo "cross-building for ${targets[*]} needs ${want[*]} (Debian: apt-get install ${want[*]})" >&2
    exit 1
  fi
  echo "[cross] installing ${want[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >&2
fi
target_args=()
for target in "${targets[@]}"; do target_args+=(--target "$target"); done
exec cargo build --locked "${target_args[@]}" --profile "${PROFILE:-dev}" \
  -p petstore-operator --bin kubectl-petstore
