#!/usr/bin/env bash
# Builds (once) the previous release of the pet store and the operator, for
# the upgrade test, and prints the folder that holds its two binaries and its
# CRD. Cached outside the clone by commit, like the Go tools by version.
#
# The build runs in a temporary `git worktree` of that commit, into a target
# directory of its own that is deleted afterwards. Everything is written
# under a `.partial` name and renamed at the end, so an interrupted build is
# never taken for a finished one.
#
#   PETSTORE_TOOLS_DIR   cache root (hack/lib.sh)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=../lib.sh
source "$here/../lib.sh"

commit=$PREVIOUS_RELEASE_COMMIT
crd_path=config/crd/petstore.example.com_pets.yaml
dest="$cache_root/release-$commit"
complete() {
  [[ -x "$1/petstore-server" && -x "$1/petstore-operator" && -f "$1/$(basename "$crd_path")" ]]
}
if complete "$dest"; then
  echo "$dest"
  exit 0
fi

if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  log "the upgrade test starts from the previous release, commit $commit, which this clone" \
    "does not hold (a shallow clone?). Fetch the history with \`git fetch --unshallow\`" \
    "(or at least that commit: \`git fetch origin $commit\`) and run the test again."
  exit 1
fi

mkdir -p "$cache_root"
# One build at a time. hack/test.sh starts this script in the background and
# its tests start before it ends: the upgrade test's own call waits here for
# that build and then finds it finished, instead of starting a second one.
exec 9>"$cache_root/release-$commit.lock"
flock 9
if complete "$dest"; then
  echo "$dest"
  exit 0
fi
partial="$cache_root/release-$commit.partial-$$"
rm -rf "$partial"
mkdir -p "$partial"
src="$partial/src"
cleanup() {
  git -C "$root" worktree remove --force "$src" >/dev/null 2>&1 || true
  git -C "$root" worktree prune >/dev/null 2>&1 || true
  # The sources and the build directory (gigabytes) go either way.
  rm -rf "$partial"
}
trap cleanup EXIT

log "building the previous release ($commit) once; this takes several minutes"
start=$SECONDS
git -C "$root" worktree add --quiet --detach "$src" "$commit"
# The dev profile without debug info and with unoptimised dependencies (as
# Tilt's images are built): the quickest cold build on 2 cores, and the
# upgrade test runs these binaries only for a few Pets. The clone's own
# target directory is not shared: the release's feature set differs, so
# little would be reused, and the two builds would take turns on its lock.
(cd "$src" && env -u CARGO_TARGET_DIR cargo build --locked --bins \
  -p petstore-server -p petstore-operator \
  --config profile.dev.debug=false --config 'profile.dev.package."*".opt-level=0' \
  --config 'profile.dev.package."*".debug=false' --target-dir "$partial/target")
mkdir -p "$partial/out"
cp "$partial/target/debug/petstore-server" "$partial/target/debug/petstore-operator" "$partial/out/"
git -C "$root" show "$commit:$crd_path" >"$partial/out/$(basename "$crd_path")"
# Another build that finished first wins; this one's output is then dropped.
if ! mv -T "$partial/out" "$dest" 2>/dev/null && ! complete "$dest"; then
  log "could not move the build to $dest"
  exit 1
fi
log "built the previous release in $((SECONDS - start))s"
echo "$dest"
