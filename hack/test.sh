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
# Every API server the tests start (the one-node cluster's too) keeps the
# operator's requests from its audit log here, for the last phase.
PETSTORE_AUDIT_DIR=$(mktemp -d)
export PETSTORE_AUDIT_DIR
# And one line a control plane of what it cost (tests/fixtures/src/cost.rs),
# for the summary: which stories the API servers' CPU goes to.
PETSTORE_COST_FILE=$(mktemp)
export PETSTORE_COST_FILE
summary() {
  printf '\n==> phase durations\n'
  for i in "${!phase_names[@]}"; do
    printf '  %-40s %5ss\n' "${phase_names[$i]}" "${phase_seconds[$i]}"
  done
  printf '  %-40s %5ss\n' "total" "$SECONDS"
  if [[ -s $PETSTORE_COST_FILE ]]; then
    printf '\n==> the stories whose API servers used the most CPU\n'
    awk -F'\t' '{ cpu[$1] += $4; planes[$1]++; all += $4; n++ }
      END { printf "  %d control planes, their API servers %.0f CPU-seconds; the 10 stories that used most (CPU-seconds, control planes, story):\n", n, all
            for (s in cpu) printf "  %7.1f  %d  %s\n", cpu[s], planes[s], s }' "$PETSTORE_COST_FILE" \
      | { IFS= read -r head; echo "$head"; sort -rn | awk 'NR <= 10'; } # not head: it leaves early, and sort's next write dies of SIGPIPE (141) under pipefail
  fi
  rm -f "$PETSTORE_COST_FILE"
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
# The Docker engine the images lane started (if it did), stopped last.
stop_dockerd() {
  local pid
  pid=$(cat "${images_dir:-/nonexistent}/dockerd.pid" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}
on_exit() {
  local pid
  for pid in ${tools_pid:-} ${release_pid:-} ${images_pid:-} ${e2e_pid:-} ${long_pid:-} ${unit_pid:-} ${tilt_pid:-}; do
    if kill -0 "$pid" 2>/dev/null; then stop_tools "$pid"; fi
  done
  stop_dockerd
  rm -rf "${tools_dir:-}" "${release_dir:-}" "${images_dir:-}" "$PETSTORE_AUDIT_DIR"
  summary
}
trap on_exit EXIT

check_prerequisites() {
  local missing=()
  # openssl: the TLS probes of tests/e2e/security.rs.
  for tool in go cargo openssl; do
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

# The tools build in the background while cargo builds the workspace. Each
# alone leaves a core idle for long stretches (module downloads, cgo's serial
# C compiles, links, the long single-threaded crates near the end of cargo's
# graph), so on 2 cores they take less together than one after the other.
# Each is cached by version outside the clone: warm, this is a few seconds
# of checks. Two lanes of tool_steps (the previous release and the images
# have a lane each, below):
#  - "tests": what `cargo test` needs, at normal priority, waited for before
#    it starts:
#      control plane: kube-apiserver, kube-controller-manager, etcd, grpcurl, ghz, kubectl
#      promtool: checks the alert rules and real scrapes (tests/e2e/monitoring.rs)
#      trace receiver: an OpenTelemetry Collector for the traces of tests/e2e/traces.rs
#      health: kstatus, Argo CD's Lua check and Flux's CEL judging Pets (tests/e2e/health.rs)
#      helm: lints, renders, installs and upgrades the chart (tests/e2e/helm.rs)
#      registry: the OCI registry the chart is pushed to and installed from (tests/e2e/oci.rs)
#      cosign: signs the pushed chart and attests its SBOM (tests/e2e/oci.rs)
#      krew: installs the kubectl plugin from a local index (tests/e2e/krew.rs)
#      static checks: hadolint and the Tiltfile check
#  - "tilt": what only the last phase needs, the nodes of tests/e2e/tilt.rs
#    and Tilt, at the lowest CPU and I/O priority, so it builds on the cores
#    the tests leave idle instead of before them; it starts once the control
#    plane is built.
# Separately, the previous release (a cargo build for the upgrade test,
# cached by commit) builds from the start at a low priority, above the
# "tilt" lane's, beside everything. The tests do not wait for it: the
# upgrade test, which needs it, waits on the build's lock when it starts.
tool_steps=(
  "tests:control plane (cached build):hack/control-plane/build.sh"
  "tests:promtool (cached build):hack/monitoring/build.sh"
  "tests:trace receiver (cached build):hack/tracing/build.sh"
  "tests:health, kstatus (cached build):hack/health/build.sh"
  "tests:helm (cached build):hack/helm/build.sh"
  "tests:registry (cached build):hack/registry/build.sh"
  "tests:cosign (cached build):hack/cosign/build.sh"
  "tests:krew (cached build):hack/krew/build.sh"
  "tests:static checks (Dockerfile, Tiltfile):hack/static-checks.sh"
  "tilt:one-node cluster and Tilt (cached build):hack/cluster/build.sh"
)
# Lower priorities for what is needed later: the previous release, then the
# images (a cold cargo build in Docker, the longest of the last two lanes),
# then the cluster's tools; all after the build and the test tools.
idle_priority() { nice -n 19 ionice -c 3 "$@"; }
low_priority() { nice -n 10 ionice -c 2 -n 7 "$@"; }
tools_dir=$(mktemp -d)
# Builds one lane's tools in order. With AFTER (a step's index), it starts
# once that step is built: the "tilt" lane waits for the control plane only,
# whose Go build cache holds most of what kubelet and the others compile,
# not for the rest of the "tests" lane (measured cold: starting after the
# whole "tests" lane left 530 s of its build after the tests).
build_lane() { # lane [after]
  local lane=$1 after=${2:-} i step script start priority
  if [[ -n $after ]]; then
    until [[ -f "$tools_dir/$after.status" ]]; do sleep 2; done
    [[ $(cat "$tools_dir/$after.status") != failed ]] || return 1
  fi
  for i in "${!tool_steps[@]}"; do
    step=${tool_steps[$i]}
    [[ ${step%%:*} == "$lane" ]] || continue
    script=${step##*:}
    start=$SECONDS
    priority=()
    [[ $lane == tilt ]] && priority=(idle_priority)
    if ! "${priority[@]}" bash "$script" >"$tools_dir/$i.log" 2>&1; then
      echo failed >"$tools_dir/$i.status"
      return 1
    fi
    echo "$((SECONDS - start))" >"$tools_dir/$i.status"
  done
}
declare -A lane_pids
build_lane tests &
lane_pids[tests]=$!
# Index 0 is the control plane (tool_steps above).
build_lane tilt 0 &
lane_pids[tilt]=$!
tools_pid="${lane_pids[tests]} ${lane_pids[tilt]}"
release_dir=$(mktemp -d)
build_previous_release() {
  local start=$SECONDS
  low_priority bash hack/previous-release/build.sh >/dev/null 2>"$release_dir/log" || return 1
  echo "$((SECONDS - start))" >"$release_dir/seconds"
}
build_previous_release &
release_pid=$!
# The images lane, at a low priority from the start, as root only (the
# Tilt story needs root anyway): the Docker engine (Debian's docker.io,
# installed and started when none answers; started at nice 15, so its
# builds are too), the Dockerfile's base images, and both images
# built as Tilt builds them. tilt ci then finds BuildKit's layers and cargo
# cache warm instead of compiling the workspace after everything else.
images_dir=$(mktemp -d)
docker_answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
prebuild_images() {
  local start=$SECONDS target
  if ! docker_answers; then
    idle_priority bash hack/cluster/host-packages.sh --engine
    # Not through idle_priority: $! must be dockerd's own PID (nice and
    # ionice exec it), for stop_dockerd.
    nice -n 15 ionice -c 3 dockerd --host=unix:///var/run/docker.sock >"$images_dir/dockerd.log" 2>&1 &
    echo $! >"$images_dir/dockerd.pid"
    for _ in $(seq 120); do docker_answers && break; sleep 0.5; done
    docker_answers || { echo "dockerd did not answer; its log:"; cat "$images_dir/dockerd.log"; return 1; }
  fi
  idle_priority bash hack/cluster/images.sh --base-only
  # The Dockerfile needs BuildKit. Tilt speaks to the engine's own; a CLI
  # does so through buildx, or by itself as Debian's docker.io does
  # (/usr/bin/docker), while a newer CLI without buildx refuses.
  local cli=docker
  if ! docker buildx version >/dev/null 2>&1; then
    [[ -x /usr/bin/docker ]] || { echo "no docker CLI here can build with BuildKit (install buildx)"; return 1; }
    cli=/usr/bin/docker
  fi
  # The Tiltfile's build argument (tiltcheck checks it is declared).
  for target in petstore-server petstore-operator; do
    DOCKER_BUILDKIT=1 "$cli" build -q --build-arg CARGO_PROFILE=dev-image \
      --target "$target" -t "$target:prebuilt" . >/dev/null
  done
  echo "$((SECONDS - start))" >"$images_dir/seconds"
}
if [[ $EUID -eq 0 ]]; then
  prebuild_images >"$images_dir/log" 2>&1 &
  images_pid=$!
fi
# With PETSTORE_SOURCE_TIMES (.ci/run sets it, for its build directory
# outside the fresh clone), files compiled before get back the time of that
# build, and cargo does not compile them again (hack/source-times.sh).
if [[ -n ${PETSTORE_SOURCE_TIMES:-} ]]; then
  bash hack/source-times.sh restore "$PETSTORE_SOURCE_TIMES"
fi
phase "cargo build (tools building beside it)" cargo build --locked --workspace --all-targets
if [[ -n ${PETSTORE_SOURCE_TIMES:-} ]]; then
  bash hack/source-times.sh keep "$PETSTORE_SOURCE_TIMES"
fi
# kubectl-petstore for linux/arm64 and windows/amd64 too: the krew story
# packs and installs an archive for each platform, and runs the arm64 one
# under qemu and the Windows one under Wine.
phase "cargo build of the plugin for linux/arm64 and windows/amd64" bash hack/cross/build.sh

# Waits until every tool of one lane is built (or one failed), shows each
# one's output and records its time as a line under the current phase.
wait_for_lane() { # lane
  local lane=$1 i step name pending
  while :; do
    pending=0
    for i in "${!tool_steps[@]}"; do
      [[ ${tool_steps[$i]%%:*} == "$lane" ]] || continue
      [[ -f "$tools_dir/$i.status" ]] || pending=1
      [[ -f "$tools_dir/$i.status" && $(cat "$tools_dir/$i.status") == failed ]] && break 2
    done
    ((pending)) || break
    kill -0 "${lane_pids[$lane]}" 2>/dev/null || break
    sleep 1
  done
  local failed=0
  for i in "${!tool_steps[@]}"; do
    step=${tool_steps[$i]}
    [[ ${step%%:*} == "$lane" ]] || continue
    name=${step#*:}; name=${name%%:*}
    if [[ ! -f "$tools_dir/$i.status" ]]; then
      failed=1
      continue
    fi
    printf '\n--> %s\n' "$name"
    cat "$tools_dir/$i.log"
    if [[ $(cat "$tools_dir/$i.status") == failed ]]; then
      echo "$name failed" >&2
      failed=1
    else
      phase_names+=("  $name (built beside)")
      phase_seconds+=("$(cat "$tools_dir/$i.status")")
    fi
  done
  return "$failed"
}
# Waits for a background job that keeps its output in DIR/log and, when it
# succeeds, its time in DIR/seconds; shows both.
wait_for_job() { # name, pid, dir
  printf '\n--> %s\n' "$1"
  if wait "$2"; then
    cat "$3/log"
    phase_names+=("  $1 (built beside)")
    phase_seconds+=("$(cat "$3/seconds")")
  else
    cat "$3/log"
    echo "$1 failed" >&2
    return 1
  fi
}
phase "tools for the tests (rest of their build)" wait_for_lane tests

# The tests start the binaries this build made. Without this, the fixtures
# would build them again for two packages only, a different feature set, and
# cargo would compile the workspace's crates a second time.
export PETSTORE_BIN_DIR="${CARGO_TARGET_DIR:-$PWD/target}/debug"
# tests/e2e's end-to-end stories with the real binaries mostly wait (for a
# watch, a Lease, a backoff): run two at a time, the CPU sat half idle, so
# they run four at a time. Beside them, at the same time, everything else:
# unit tests with fakes and a mock API server, and the benchmarks' smoke run.
# cargo holds its build lock only while it builds, so both commands run
# their test binaries at once. The end-to-end lines are marked "e2e |", the
# Tilt quick start's (below) "tilt |".
e2e_threads=${PETSTORE_E2E_THREADS:-4}
# libtest starts a binary's tests in name order, and the longest stories
# (the upgrade, the soaks, the import of 1,000 records) sort last: they ran
# on alone at the end, a minute and more after the others. They start at
# once instead, two at a time in a test process of their own, beside the
# rest.
long_stories=(upgrade:: plans_soak:: chaos:: import::)
# The attack matrix bounds how soon each of 3,000 attackers' Pets is held
# (2 s): a latency, which the suite's own load on 2 cores stretched to a
# minute (p50 1.1 s against 40 ms alone). It runs after the rest, alone.
alone_stories=(attacks::the_attack_matrix)
run_tests() {
  local e2e_log long_log unit_log tilt_log status=0 skips=()
  tilt_pid=
  e2e_log=$(mktemp)
  long_log=$(mktemp)
  unit_log=$(mktemp)
  tilt_log=$(mktemp)
  for story in "${long_stories[@]}" "${alone_stories[@]}"; do skips+=(--skip "$story"); done
  # --workspace everywhere: the features of the whole workspace, so that
  # cargo reuses the build instead of compiling again for one package.
  (cargo test --locked --workspace --test e2e --bin petstore-operator-faults \
     -- "${long_stories[@]}" --test-threads=2 2>&1 \
     | tee "$long_log" | sed -u 's/^/e2e | /') &
  long_pid=$!
  (cargo test --locked --workspace --test e2e --bin petstore-operator-faults \
     -- --skip tilt:: "${skips[@]}" --test-threads="$(( e2e_threads > 2 ? e2e_threads - 1 : 1 ))" 2>&1 \
     | tee "$e2e_log" | sed -u 's/^/e2e | /') &
  e2e_pid=$!
  (set -o pipefail; cargo test --locked --workspace --exclude e2e 2>&1 | tee "$unit_log") &
  unit_pid=$!
  # The Tilt quick start on the one-node cluster, beside the rest once its
  # tools and images are built (at once, warm): it waits on pods, images
  # and Tilt much of its time, which ran alone at the end for 90 to 110 s.
  if wait_for_tilt_tools; then
    (set -o pipefail; run_tilt_test "$tilt_log" 2>&1 | sed -u 's/^/tilt | /') &
    tilt_pid=$!
  else
    status=1
  fi
  wait "$unit_pid" || status=1
  wait "$e2e_pid" || status=1
  wait "$long_pid" || status=1
  if [[ -n $tilt_pid ]]; then wait "$tilt_pid" || status=1; fi
  e2e_pid=
  long_pid=
  unit_pid=
  tilt_pid=
  cat "$unit_log" "$e2e_log" "$long_log" "$tilt_log" >>"$test_log"
  rm -f "$unit_log" "$e2e_log" "$long_log" "$tilt_log"
  return "$status"
}
# Builds both images (BuildKit caches persist in the engine's data root) and
# runs the README's Tilt quick start against real pods; needs root.
run_tilt_test() { # log
  # --workspace, as above, so that cargo reuses the build instead of
  # compiling for the feature set of one package.
  cargo test --locked --workspace -- tilt:: --nocapture 2>&1 | tee "$1"
}
wait_for_tilt_tools() {
  wait_for_lane tilt || return 1
  wait "${lane_pids[tests]}" "${lane_pids[tilt]}"
  rm -rf "$tools_dir"
  [[ -n ${images_pid:-} ]] || return 0
  wait_for_job "images for Tilt (low priority)" "$images_pid" "$images_dir"
}
phase "cargo test, and the Tilt quick start beside it" run_tests
run_alone() {
  cargo test --locked --workspace --test e2e -- "${alone_stories[@]}" 2>&1 \
    | tee -a "$test_log" | sed -u 's/^/e2e | /'
  return "${PIPESTATUS[0]}"
}
phase "attack matrix (alone)" run_alone
# The upgrade test waited for it (hack/previous-release/build.sh takes a
# lock), so it has ended: this shows its time and output.
wait_for_previous_release() {
  wait_for_job "previous release (low priority)" "$release_pid" "$release_dir" || return 1
  rm -rf "$release_dir"
}
phase "previous release (built during the tests)" wait_for_previous_release
# RBAC equal to use: the Roles and ClusterRoles config/ gives the operator
# against every request its ServiceAccount made of every API server above,
# from their audit logs. A verb granted and never used fails, and so does a
# request refused or allowed by no rule (xtask/src/rbac_audit.rs). The
# workspace build's binary: `cargo run -p xtask` would resolve features for
# xtask alone and compile again.
run_rbac_audit() {
  "${CARGO_TARGET_DIR:-$PWD/target}/debug/xtask" rbac-audit "$PETSTORE_AUDIT_DIR"
}
phase "RBAC equal to use (audit of the suite)" run_rbac_audit
