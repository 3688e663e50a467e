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
# A failed phase ends the command; the Go tools building in the background
# (and their go and cc children) end with it.
stop_tools() {
  local pid=$1 child
  for child in $(pgrep -P "$pid"); do stop_tools "$child"; done
  kill "$pid" 2>/dev/null || true
}
on_exit() {
  if [[ -n ${tools_pid:-} ]] && kill -0 "$tools_pid" 2>/dev/null; then stop_tools "$tools_pid"; fi
  summary
}
trap on_exit EXIT

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

# The Go tools build in the background while cargo builds the workspace. Each
# alone leaves a core idle for long stretches (module downloads, cgo's serial
# C compiles, links, the long single-threaded crates near the end of cargo's
# graph), so on 2 cores the two together take less than one after the other.
# Each tool is cached by version outside the clone: warm, this is a few
# seconds of checks.
#   control plane: kube-apiserver, kube-controller-manager, etcd, grpcurl, ghz, kubectl
#   one-node cluster and Tilt: the nodes of tests/e2e/tilt.rs
#   promtool: checks the alert rules and real scrapes (tests/e2e/monitoring.rs)
#   trace receiver: an OpenTelemetry Collector for the traces of tests/e2e/traces.rs
#   static checks: hadolint and the Tiltfile check
tool_steps=(
  "control plane (cached build):hack/control-plane/build.sh"
  "one-node cluster and Tilt (cached build):hack/cluster/build.sh"
  "promtool (cached build):hack/monitoring/build.sh"
  "trace receiver (cached build):hack/tracing/build.sh"
  "static checks (Dockerfile, Tiltfile):hack/static-checks.sh"
)
tools_dir=$(mktemp -d)
build_tools() {
  local i step name script start
  for i in "${!tool_steps[@]}"; do
    step=${tool_steps[$i]}; name=${step%%:*}; script=${step#*:}
    start=$SECONDS
    if ! bash "$script" >"$tools_dir/$i.log" 2>&1; then
      echo "failed" >"$tools_dir/$i.status"
      return 1
    fi
    echo "$((SECONDS - start))" >"$tools_dir/$i.status"
  done
}
build_tools &
tools_pid=$!
phase "cargo build (Go tools building beside it)" cargo build --locked --workspace --all-targets
wait_for_tools() {
  local failed=0 i name
  wait "$tools_pid" || failed=1
  for i in "${!tool_steps[@]}"; do
    name=${tool_steps[$i]%%:*}
    [[ -f "$tools_dir/$i.status" ]] || continue
    printf '\n--> %s\n' "$name"
    cat "$tools_dir/$i.log"
    if [[ $(cat "$tools_dir/$i.status") == failed ]]; then
      echo "$name failed" >&2
    else
      phase_names+=("  $name (beside cargo)")
      phase_seconds+=("$(cat "$tools_dir/$i.status")")
    fi
  done
  rm -rf "$tools_dir"
  return "$failed"
}
phase "Go tools (rest of their build)" wait_for_tools
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
