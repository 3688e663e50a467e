#!/usr/bin/env bash
# Cargo takes a workspace crate's build as fresh when none of its sources
# is newer than the build, by mtime. A fresh clone gives every file the
# time of the clone, so a warm build directory kept outside it compiled the
# whole workspace again: 35 to 138 s of CI's warm run, for nothing.
#
#   hack/source-times.sh restore MANIFEST   before the build
#   hack/source-times.sh keep MANIFEST      after it succeeded
#
# restore gives each tracked file whose content is byte for byte what the
# last successful build compiled the mtime it had then; any other file keeps
# its own, newer one, and what it feeds is compiled. It also writes what
# this build compiles (content hash and mtime, taken before the build) to
# MANIFEST.next, and removes MANIFEST: a build that fails or is cut short
# may have compiled some crates from other content, and then no file's old
# time may be given back. keep makes MANIFEST.next the manifest.
#
# Only for a build directory no other build writes to (.ci/run's): a plain
# `cargo build` there of other content, and that content reverted, would
# leave artifacts this takes for the manifest's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

action=${1:?usage: hack/source-times.sh restore|keep MANIFEST}
manifest=${2:?usage: hack/source-times.sh restore|keep MANIFEST}

case $action in
  restore)
    mkdir -p "$(dirname "$manifest")"
    declare -A kept_time=()
    if [[ -f $manifest ]]; then
      # hash <TAB> mtime <TAB> path, one tracked file a line.
      while IFS=$'\t' read -r hash time path; do
        kept_time["$hash $path"]=$time
      done <"$manifest"
    fi
    rm -f "$manifest"
    paths=()
    while IFS= read -r path; do
      # A tracked file deleted in the work tree has no time to keep.
      [[ -e $path ]] && paths+=("$path")
    done < <(git ls-files)
    mapfile -t hashes < <(printf '%s\n' "${paths[@]}" | git hash-object --stdin-paths)
    mapfile -t times < <(stat -c %.9Y -- "${paths[@]}")
    restored=0
    next="$manifest.next"
    : >"$next"
    for i in "${!paths[@]}"; do
      path=${paths[$i]} hash=${hashes[$i]} time=${times[$i]}
      kept=${kept_time["$hash $path"]:-}
      if [[ -n $kept && $kept != "$time" ]]; then
        touch -m -d "@$kept" -- "$path"
        time=$kept
        restored=$((restored + 1))
      fi
      printf '%s\t%s\t%s\n' "$hash" "$time" "$path" >>"$next"
    done
    echo "source times: ${restored} of ${#paths[@]} files given the time of the build that compiled them"
    ;;
  keep)
    mv "$manifest.next" "$manifest"
    ;;
  *)
    echo "usage: hack/source-times.sh restore|keep MANIFEST" >&2
    exit 2
    ;;
esac
