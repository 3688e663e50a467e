#!/usr/bin/env bash
# Runs the benchmarks on release builds and writes BENCHMARKS.md and
# docs/convergence.svg. Honours CARGO_TARGET_DIR.
#
#   hack/bench.sh                    # N = 100, 1000, 5000, 20000 and the store
#   hack/bench.sh --sizes 1000,5000  # other sizes
#   hack/bench.sh --skip-store       # the operator only; keeps the store section
#   hack/bench.sh --store-only       # the store only; keeps the operator section
#   hack/bench.sh --smoke            # tiny, to check that it works
#   hack/bench.sh --import 10000     # only `kubectl petstore import` of N records
#   hack/bench.sh --fairness 10000   # only a burst of N Pets in one namespace against
#                                    # new Pets in another, each timed until Ready
#   hack/bench.sh --token-cost 1h    # only tenancy's TokenRequests and store calls
#                                    # at steady state, 20 namespaces, over the window
#   hack/bench.sh --spread 20000     # only N Pets over 200 namespaces on 3 stores with
#                                    # tenancy against one namespace on one store, and
#                                    # operator ÷ floor side by side in that layout
#   hack/bench.sh --rotation 30m     # only certificate rotation: a TLS file changed every
#                                    # --rotation-period (60s), --pets (1000) renamed
#                                    # throughout; each change timed until in use
#   hack/bench.sh --at-scale 100000 # only the operator alone at N: convergence, drift, restart
#                                    # and steady state, the control plane's memory beside them
#   hack/bench.sh --flood 60s        # only the operator's store calls, renames alone and
#                                    # then while ghz floods the store from another client
#   hack/bench.sh --tracing ...      # with every trace exported to a local OpenTelemetry Collector
#
# The arguments go to petstore-bench (benches/) unchanged; `--help` lists
# them all, with their defaults.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/control-plane/build.sh >/dev/null
cargo build --release --locked --workspace --bins
target_dir="$(cargo metadata --format-version 1 --no-deps \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
# The processes it starts (the store, the operator, the kubectl-petstore
# plugin) are the binaries just built: building them again
# for one package's feature set would compile the crates again, in the
# middle of a measured run.
export PETSTORE_BIN_DIR="$target_dir/release"
exec "$target_dir/release/petstore-bench" "$@"
