#!/usr/bin/env bash
# Checks the PrometheusRule's groups and runs the alert unit tests, as
# tests/e2e/monitoring.rs does inside `cargo test`, for editing the rules:
#
#   bash hack/monitoring/test-rules.sh
#
# promtool reads plain rules files, so `spec` is cut out of
# config/monitoring/prometheusrule.yaml into petstore.rules.yaml, the file
# the tests' rule_files name (../petstore.rules.yaml), one folder above
# copies of the tests.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
monitoring="$here/../../config/monitoring"
promtool="$(bash "$here/build.sh" | tail -n1)/promtool"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Everything after the top-level `spec:` line, two spaces of indent removed.
awk 'found { sub(/^  /, ""); print } /^spec:/ { found = 1 }' \
  "$monitoring/prometheusrule.yaml" >"$work/petstore.rules.yaml"
mkdir "$work/tests"
cp "$monitoring"/tests/*.yaml "$work/tests/"
"$promtool" check rules "$work/petstore.rules.yaml"
"$promtool" test rules "$work"/tests/*.yaml
