#!/usr/bin/env bash
# The project's one test command: builds everything it needs (the local
# control plane is built once and cached outside the clone), then runs the
# unit tests and the end-to-end tests against a real kube-apiserver.
#
#   hack/test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

phase_names=()
phase_seconds=()
phase() { # name, command...
  local name=$1; shift
  local start=$SECONDS
  printf '\n==> %s\n' "$name"
  "$@"
  phase_names+=("$name")
  phase_seconds+=($((SECONDS - start)))
}
test_log=$(mktemp)
summary() {
  printf '\n==> phase durations\n'
  for i in "${!phase_names[@]}"; do
    printf '  %-40s %5ss\n' "${phase_names[$i]}" "${phase_seconds[$i]}"
  done
  printf '  %-40s %5ss\n' "total" "$SECONDS"
  # One closing line for every test binary together (cargo ends on doc-tests).
  awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
       END { printf "\ntests: %d passed, %d failed\n", p, f }' "$test_log"
  rm -f "$test_log"
}
trap summary EXIT

check_prerequisites() {
  local missing=()
  for tool in go cargo; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  # The conformance suite and an end-to-end test run a real PostgreSQL.
  if [[ -z "${PETSTORE_POSTGRES_BIN:-}" ]] && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    missing+=("PostgreSQL server binaries (Debian: apt-get install postgresql; or set PETSTORE_POSTGRES_BIN)")
  fi
  if ((${#missing[@]})); then
    echo "missing tools: ${missing[*]}" >&2
    exit 1
  fi
}

phase "prerequisites" check_prerequisites
phase "control plane (cached build)" bash hack/control-plane/build.sh
# kubelet, kube-scheduler, kube-proxy, Tilt, registry, CoreDNS,
# local-path-provisioner: the one-node cluster of tests/e2e/tilt.rs.
phase "one-node cluster and Tilt (cached build)" bash hack/cluster/build.sh
# promtool checks the alert rules and real scrapes (tests/e2e/monitoring.rs);
# An OpenTelemetry Collector receives the traces of tests/e2e/traces.rs.
phase "promtool (cached build)" bash hack/monitoring/build.sh
phase "trace receiver (cached build)" bash hack/tracing/build.sh
phase "static checks (Dockerfile, Tiltfile)" bash hack/static-checks.sh
phase "cargo build" cargo build --locked --workspace --all-targets
# The tests start the binaries this build made. Without this, the fixtures
# would build them again for two packages only, a different feature set, and
# cargo would compile the workspace's crates a second time.
export PETSTORE_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/debug"
# Both suites run together: unit tests with fakes and a mock API server, and
# tests/e2e's end-to-end stories with the real binaries.
# The Tilt quick start on the one-node cluster runs in a phase of its own.
run_tests() {
  cargo test --locked --workspace -- --skip tilt:: 2>&1 | tee "$test_log"
}
phase "cargo test" run_tests
# Builds both images (BuildKit caches persist in the engine's data root) and
# runs the README's Tilt quick start against real pods; needs root.
run_tilt_test() {
  # --workspace, as above, so that cargo reuses the build instead of
  # compiling for the feature set of one package.
  cargo test --locked --workspace -- tilt:: --nocapture 2>&1 | tee -a "$test_log"
}
phase "Tilt quick start on a one-node cluster" run_tilt_test
