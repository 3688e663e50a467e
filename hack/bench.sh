#!/usr/bin/env bash
# Runs the benchmarks on release builds and writes BENCHMARKS.md and
# docs/convergence.svg. Takes about 15 minutes on 2 cores.
#
#   hack/bench.sh                    # N = 100, 1000, 5000
#   hack/bench.sh --sizes 100,1000   # other sizes
#   hack/bench.sh --smoke            # tiny, to check that it works
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash hack/control-plane/build.sh >/dev/null
cargo build --release --locked --workspace --bins
exec target/release/petstore-bench "$@"
