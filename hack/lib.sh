# Sourced by each hack/*/build.sh once it has set `here` to its own folder:
# that folder's versions.env, the cache root every built tool shares
# (outside the clone, keyed by version, so only a missing binary triggers a
# build), and log(), which tags each line with the folder's name.
#
#   PETSTORE_TOOLS_DIR   cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator)
# shellcheck source=/dev/null
source "$here/versions.env"
cache_root="${PETSTORE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/petstore-operator}"
log_tag=$(basename "$here")
log() { printf '[%s] %s\n' "$log_tag" "$*" >&2; }
# tool_dir NAME: the cache folder NAME (a name that carries the versions),
# made if missing.
tool_dir() { mkdir -p "$cache_root/$1" && printf '%s\n' "$cache_root/$1"; }
